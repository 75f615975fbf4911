package nodeagent

import (
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"strings"
)

// ErrImageNotMapped is returned for an image no --image-dir maps.
var ErrImageNotMapped = errors.New("image not mapped to a local directory")

// ImageMap maps image repositories (any tag or digest) to local directories
// holding the image's executables.
type ImageMap map[string]string

// ParseImageDir parses one --image-dir value, "<image>=<dir>".
func (m ImageMap) ParseImageDir(v string) error {
	img, dir, ok := strings.Cut(v, "=")
	if !ok || img == "" || dir == "" {
		return fmt.Errorf("--image-dir %q: want <image>=<dir>", v)
	}
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("--image-dir %q: dir must be absolute", v)
	}
	m[repository(img)] = filepath.Clean(dir)
	return nil
}

// repository strips the tag and digest: ghcr.io/x/y:v1@sha256:... → ghcr.io/x/y.
func repository(image string) string {
	if i := strings.IndexByte(image, '@'); i >= 0 {
		image = image[:i]
	}
	// A ':' after the last '/' starts the tag; one before it is a registry port.
	if i := strings.LastIndexByte(image, ':'); i > strings.LastIndexByte(image, '/') {
		image = image[:i]
	}
	return image
}

// Resolve returns the local executable for a container: the mapped
// directory joined with the base name of command[0] (or of args[0] when the
// container has no command, as an image without an entrypoint would run it).
func (m ImageMap) Resolve(image string, command, args []string) (string, error) {
	dir, ok := m[repository(image)]
	if !ok {
		return "", fmt.Errorf("%w: %q (mapped: %s)", ErrImageNotMapped, image, m.describe())
	}
	argv0 := ""
	switch {
	case len(command) > 0:
		argv0 = command[0]
	case len(args) > 0:
		argv0 = args[0]
	default:
		return "", fmt.Errorf("image %q: container has neither command nor args (images have no entrypoint here)", image)
	}
	base := path.Base(argv0)
	if base == "/" || base == "." || base == ".." {
		return "", fmt.Errorf("image %q: command %q names no file", image, argv0)
	}
	return filepath.Join(dir, base), nil
}

func (m ImageMap) describe() string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for img, dir := range m {
		parts = append(parts, img+"="+dir)
	}
	return strings.Join(parts, ", ")
}
