package image

import (
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// The Skipper image, as the Dockerfile gives it: its `go build` line's
// binaries at /<binary>, USER and ENTRYPOINT (a test compares them). Every
// directory under cmd/ is one of these; the node agent's container init
// (tests/cmd) is the stand-in's, not the product's, and stays out.
var (
	SkipperBinaries   = []string{"skipper-controller", "skipper-noderouter", "skipper-echo"}
	SkipperUser       = "65532:65532"
	SkipperEntrypoint = []string{"/skipper-controller"}
)

// The sandbox ("pause") image: the skipper-pause binary at /pause, run as
// the user Kubernetes' own pause image runs as.
var (
	PauseBinary     = "skipper-pause"
	PauseUser       = "65535:65535"
	PauseEntrypoint = []string{"/pause"}
)

// defaultEnv is the environment distroless/static sets (less
// SSL_CERT_FILE: there are no certificates here; see the package doc).
var defaultEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}

// SkipperSpec is the Skipper image from the binaries in binDir, for this
// machine's architecture.
func SkipperSpec(binDir string, created time.Time) Spec {
	var files []File
	for _, b := range SkipperBinaries {
		files = append(files, File{Name: b, Path: filepath.Join(binDir, b)})
	}
	return linuxSpec(files, SkipperUser, SkipperEntrypoint, created)
}

// PauseSpec is the sandbox image from binDir/skipper-pause, for this
// machine's architecture.
func PauseSpec(binDir string, created time.Time) Spec {
	files := []File{{Name: strings.TrimPrefix(PauseEntrypoint[0], "/"), Path: filepath.Join(binDir, PauseBinary)}}
	return linuxSpec(files, PauseUser, PauseEntrypoint, created)
}

func linuxSpec(files []File, user string, entrypoint []string, created time.Time) Spec {
	var names []string
	for _, f := range files {
		names = append(names, "/"+f.Name)
	}
	return Spec{
		Files:        files,
		User:         user,
		Entrypoint:   entrypoint,
		Env:          defaultEnv,
		OS:           "linux",
		Architecture: runtime.GOARCH,
		Created:      created,
		CreatedBy:    "skipper-image build: " + strings.Join(names, " "),
	}
}
