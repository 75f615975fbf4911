package cluster

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
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

// ParseEnv reads what FormatEnv wrote: `export K='v'` lines, undoing the
// quoting. Other lines are ignored.
func ParseEnv(data string) map[string]string {
	vals := map[string]string{}
	for _, line := range strings.Split(data, "\n") {
		k, v, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "export "), "=")
		if !ok || k == "" {
			continue
		}
		if len(v) >= 2 && v[0] == '\'' && v[len(v)-1] == '\'' {
			v = strings.ReplaceAll(v[1:len(v)-1], `'\''`, "'")
		}
		vals[k] = v
	}
	return vals
}

// ReadEnv parses the env file at path (.skipper/env of a running cluster).
func ReadEnv(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseEnv(string(b)), nil
}

// LayoutDigest identifies the images make image wrote to binDir/image:
// the SHA-256 of the layout's index.json, which names every image's
// manifest digest.
func LayoutDigest(binDir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(binDir, "image", "index.json"))
	if err != nil {
		return "", fmt.Errorf("image layout (make image): %w", err)
	}
	return fmt.Sprintf("sha256:%x", sha256.Sum256(b)), nil
}

// ImageFromEnv is the Skipper image a running cluster's nodes pull:
// SKIPPER_CLUSTER_IMAGE of its env file, or the image in the default topology's
// registry when an older env lacks it.
func ImageFromEnv(env map[string]string) string {
	if img := env["SKIPPER_CLUSTER_IMAGE"]; img != "" {
		return img
	}
	c := Config{Topology: DefaultTopology()}
	return c.LocalImage("skipper-dev/skipper", "dev")
}
