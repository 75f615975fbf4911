package loglevel

import (
	"log/slog"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    slog.Level
		wantErr bool
	}{
		{name: "debug", in: "debug", want: slog.LevelDebug},
		{name: "info", in: "info", want: slog.LevelInfo},
		{name: "warn, any case", in: "WARN", want: slog.LevelWarn},
		{name: "error", in: "error", want: slog.LevelError},
		{name: "an offset", in: "info+2", want: slog.LevelInfo + 2},
		{name: "unknown", in: "loud", wantErr: true},
		{name: "empty", in: "", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(tt.in)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("Parse(%q) = %v, %v; want %v, error %v", tt.in, got, err, tt.want, tt.wantErr)
			}
			if err != nil && !strings.Contains(err.Error(), `"`+tt.in+`"`) {
				t.Errorf("error %q does not name the value", err)
			}
		})
	}
}
