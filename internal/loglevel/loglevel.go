package loglevel

import (
	"fmt"
	"log/slog"
)

// Parse returns the slog level a --log-level value names: debug, info,
// warn or error, in any case, optionally with an offset as slog writes it
// (info+2). The error names the value and the choices; the caller adds the
// flag's name.
func Parse(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("%q is not one of debug, info, warn, error", s)
	}
	return l, nil
}
