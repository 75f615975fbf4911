package image

import (
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// The Skipper image, as the Dockerfile gives it: its `go build` line's
// binaries at /<binary>, USER and ENTRYPOINT (a test compares them). Every
// directory under cmd/ is one of these; test binaries (tests/cmd) stay
// out.
var (
	SkipperBinaries   = []string{"skipper-controller", "skipper-noderouter", "skipper-echo", "skipper-agent"}
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

// The cluster DNS image: CoreDNS (bin/coredns, built by make coredns from
// the nested module tests/coredns) at /coredns, run as the Skipper image's
// unprivileged user, with the file capability NET_BIND_SERVICE as
// CoreDNS's own image has (`setcap cap_net_bind_service=+ep`): the
// container runtime drops ambient capabilities, so a non-root process gets
// a capability its pod adds only from its file (tests/cluster/dns adds
// NET_BIND_SERVICE and drops the rest, so it can listen on port 53).
var (
	CoreDNSBinary     = "coredns"
	CoreDNSUser       = "65532:65532"
	CoreDNSEntrypoint = []string{"/coredns"}
	CoreDNSCaps       = uint64(1) << CapNetBindService
)

// The e2e tests' pod image: skipper-testpod (tests/cmd, built by make
// build) at /testpod, run as the Skipper image's unprivileged user. Its
// subcommands do what a test pod's containers need and an image without a
// shell cannot (write a file, block, probe, resolve a name).
var (
	TestPodBinary     = "skipper-testpod"
	TestPodUser       = "65532:65532"
	TestPodEntrypoint = []string{"/testpod"}
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
	return oneBinarySpec(binDir, PauseBinary, PauseUser, PauseEntrypoint, created)
}

// CoreDNSSpec is the cluster DNS image from binDir/coredns, for this
// machine's architecture.
func CoreDNSSpec(binDir string, created time.Time) Spec {
	s := oneBinarySpec(binDir, CoreDNSBinary, CoreDNSUser, CoreDNSEntrypoint, created)
	s.Files[0].Caps = CoreDNSCaps
	return s
}

// The go-httpbin image (deploy/examples/protocols): the upstream command,
// unchanged (bin/go-httpbin, built by make httpbin from the nested module
// tests/httpbin), at /go-httpbin, run as the Skipper image's unprivileged
// user. It listens on 8080 by default.
var (
	HTTPBinBinary     = "go-httpbin"
	HTTPBinUser       = "65532:65532"
	HTTPBinEntrypoint = []string{"/go-httpbin"}
)

// HTTPBinSpec is go-httpbin's image from binDir/go-httpbin, for this
// machine's architecture.
func HTTPBinSpec(binDir string, created time.Time) Spec {
	return oneBinarySpec(binDir, HTTPBinBinary, HTTPBinUser, HTTPBinEntrypoint, created)
}

// TestPodSpec is the e2e tests' pod image from binDir/skipper-testpod,
// for this machine's architecture.
func TestPodSpec(binDir string, created time.Time) Spec {
	return oneBinarySpec(binDir, TestPodBinary, TestPodUser, TestPodEntrypoint, created)
}

// oneBinarySpec is the image of binDir/binary alone, at the path its
// entrypoint runs.
func oneBinarySpec(binDir, binary, user string, entrypoint []string, created time.Time) Spec {
	files := []File{{Name: strings.TrimPrefix(entrypoint[0], "/"), Path: filepath.Join(binDir, binary)}}
	return linuxSpec(files, user, entrypoint, created)
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
