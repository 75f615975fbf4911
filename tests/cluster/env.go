package cluster

import (
	"fmt"
	"os"
	"strings"
)

// EnvVar is one line of .skipper/env.
type EnvVar struct{ Key, Value string }

// FormatEnv renders `export K='v'` lines, quoting values for POSIX shells.
func FormatEnv(vars []EnvVar) string {
	var b strings.Builder
	for _, v := range vars {
		fmt.Fprintf(&b, "export %s=%s\n", v.Key, shellQuote(v.Value))
	}
	return b.String()
}

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	if err := os.WriteFile(path+".tmp", data, mode); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}
