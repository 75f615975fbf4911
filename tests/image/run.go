package image

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"skipper.dev/skipper/controller/flagenv"
)

// BuildConfig configures `skipper-image build`.
type BuildConfig struct {
	Bin             string // directory holding the binaries
	Out             string // the OCI image layout written
	Tag             string // the Skipper image's reference
	PauseTag        string // the sandbox image's reference
	CoreDNSTag      string // the cluster DNS image's reference
	TestPodTag      string // the e2e tests' pod image's reference
	HTTPBinTag      string // go-httpbin's image's reference (deploy/examples/protocols)
	SourceDateEpoch int64  // every mtime and created time, in Unix seconds
}

// ServeConfig configures `skipper-image serve`.
type ServeConfig struct {
	Addr            string
	Layout          string
	ShutdownTimeout time.Duration
}

// DefaultBuildConfig returns build's defaults, in one place: make image's
// paths and deploy/base's repositories (a local overlay changes registry
// and tag).
func DefaultBuildConfig() BuildConfig {
	return BuildConfig{
		Bin:        "bin",
		Out:        "bin/image",
		Tag:        "ghcr.io/skipper-dev/skipper:dev",
		PauseTag:   "ghcr.io/skipper-dev/pause:dev",
		CoreDNSTag: "ghcr.io/skipper-dev/coredns:dev",
		TestPodTag: "ghcr.io/skipper-dev/testpod:dev",
		HTTPBinTag: "ghcr.io/skipper-dev/httpbin:dev",
	}
}

// DefaultServeConfig returns serve's defaults, in one place.
func DefaultServeConfig() ServeConfig {
	return ServeConfig{Addr: "127.0.0.1:5000", Layout: "bin/image", ShutdownTimeout: 5 * time.Second}
}

// Validate reports every problem at once.
func (c BuildConfig) Validate() error {
	var errs []error
	if c.Bin == "" {
		errs = append(errs, errors.New("--bin is required"))
	}
	if c.Out == "" {
		errs = append(errs, errors.New("--out is required"))
	}
	tags := []struct{ flag, ref string }{{"--tag", c.Tag}, {"--pause-tag", c.PauseTag}, {"--coredns-tag", c.CoreDNSTag}, {"--testpod-tag", c.TestPodTag}, {"--httpbin-tag", c.HTTPBinTag}}
	for i, t := range tags {
		if _, err := ParseTag(t.ref); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", t.flag, err))
		}
		for _, u := range tags[:i] {
			if u.ref == t.ref {
				errs = append(errs, fmt.Errorf("%s and %s are both %q", u.flag, t.flag, t.ref))
			}
		}
	}
	if c.SourceDateEpoch < 0 {
		errs = append(errs, fmt.Errorf("--source-date-epoch %d must not be negative", c.SourceDateEpoch))
	}
	return errors.Join(errs...)
}

// Validate reports every problem at once.
func (c ServeConfig) Validate() error {
	var errs []error
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		errs = append(errs, fmt.Errorf("--addr %q: %w", c.Addr, err))
	}
	if c.Layout == "" {
		errs = append(errs, errors.New("--layout is required"))
	}
	if c.ShutdownTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--shutdown-timeout %s must be positive", c.ShutdownTimeout))
	}
	return errors.Join(errs...)
}

// Build assembles the Skipper image, the sandbox image, the cluster DNS
// image, the e2e tests' pod image and go-httpbin's from the binaries in
// c.Bin and writes the five to the layout c.Out.
func Build(ctx context.Context, c BuildConfig) ([]Summary, error) {
	created := time.Unix(c.SourceDateEpoch, 0).UTC()
	var images []Tagged
	for _, i := range []struct {
		ref  string
		spec Spec
	}{
		{c.Tag, SkipperSpec(c.Bin, created)},
		{c.PauseTag, PauseSpec(c.Bin, created)},
		{c.CoreDNSTag, CoreDNSSpec(c.Bin, created)},
		{c.TestPodTag, TestPodSpec(c.Bin, created)},
		{c.HTTPBinTag, HTTPBinSpec(c.Bin, created)},
	} {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		ref, err := ParseTag(i.ref)
		if err != nil {
			return nil, err
		}
		img, err := Assemble(i.spec)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", ref, err)
		}
		images = append(images, Tagged{Ref: ref, Image: img})
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return WriteLayout(c.Out, images)
}

const usage = `Usage: skipper-image <command> [flags]

Builds Skipper's container images without Docker (go-containerregistry) and
serves them from an in-process registry.

Commands:
  build   write the Skipper image, the sandbox ("pause") image, the
          cluster DNS (CoreDNS) image and the e2e tests' pod image from the
          binaries in a directory as an OCI image layout
  serve   serve a registry holding every image of a layout

Run skipper-image <command> --help for its flags.
`

// Run is skipper-image: args are the command line after the program name,
// getenv looks up the flags' environment fallbacks (package os's LookupEnv,
// from main). --help (of the program or a command) prints to stderr and
// returns nil.
func Run(ctx context.Context, args []string, getenv func(string) (string, bool), stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("no command given")
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stderr, usage)
		return nil
	case "build":
		return runBuild(ctx, args[1:], getenv, stderr)
	case "serve":
		return runServe(ctx, args[1:], getenv, stderr)
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q", args[0])
}

func newLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, nil))
}

func runBuild(ctx context.Context, args []string, getenv func(string) (string, bool), stderr io.Writer) error {
	c, err := ParseBuildConfig(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("build: %w", err)
	}
	start := time.Now()
	out, err := Build(ctx, c)
	if err != nil {
		return fmt.Errorf("build: %w", err)
	}
	log := newLogger(stderr)
	for _, s := range out {
		log.Info("image", "ref", s.Ref, "digest", s.Digest.String(), "size", s.Size, "layout", c.Out)
	}
	log.Info("built", "images", len(out), "took", time.Since(start).Round(time.Millisecond))
	return nil
}

func runServe(ctx context.Context, args []string, getenv func(string) (string, bool), stderr io.Writer) error {
	c, err := ParseServeConfig(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	images, err := ReadLayout(c.Layout)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", c.Addr)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	log := newLogger(stderr)
	err = Serve(ctx, ln, images, ServeOptions{
		ShutdownTimeout: c.ShutdownTimeout,
		Log:             log,
		Ready: func(addr string, pushed []Summary) {
			for _, s := range pushed {
				log.Info("image", "ref", s.Ref, "digest", s.Digest.String(), "size", s.Size)
			}
			log.Info("serving", "addr", addr, "images", len(pushed))
		},
	})
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// ParseBuildConfig reads build's flags, falling back to the environment
// variables named in --help, looked up by getenv, by flagenv's rules. It
// returns flag.ErrHelp after printing --help.
func ParseBuildConfig(args []string, getenv func(string) (string, bool), stderr io.Writer) (BuildConfig, error) {
	c := DefaultBuildConfig()
	fs := newFlagSet("build")
	fs.StringVar(&c.Bin, "bin", c.Bin, "directory holding skipper-controller, skipper-noderouter, skipper-echo, skipper-agent, skipper-pause, coredns, skipper-testpod and go-httpbin")
	fs.StringVar(&c.Out, "out", c.Out, "directory of the OCI image layout written (created if missing; its index.json is replaced and blobs no image uses are removed)")
	fs.StringVar(&c.Tag, "tag", c.Tag, "reference of the Skipper image, registry/repository:tag (serve pushes it to its own address, same repository and tag)")
	fs.StringVar(&c.PauseTag, "pause-tag", c.PauseTag, "reference of the sandbox (\"pause\") image, registry/repository:tag")
	fs.StringVar(&c.CoreDNSTag, "coredns-tag", c.CoreDNSTag, "reference of the cluster DNS (CoreDNS) image, registry/repository:tag")
	fs.StringVar(&c.TestPodTag, "testpod-tag", c.TestPodTag, "reference of the e2e tests' pod image, registry/repository:tag")
	fs.StringVar(&c.HTTPBinTag, "httpbin-tag", c.HTTPBinTag, "reference of go-httpbin's image (deploy/examples/protocols), registry/repository:tag")
	fs.Int64Var(&c.SourceDateEpoch, "source-date-epoch", c.SourceDateEpoch, "mtime of every file and the images' created time, in Unix seconds (reproducible-builds.org): the same binaries and epoch give the same digests")
	vars := flagenv.Vars{
		"bin":               {"SKIPPER_IMAGE_BIN"},
		"out":               {"SKIPPER_IMAGE_LAYOUT"},
		"tag":               {"SKIPPER_IMAGE"},
		"pause-tag":         {"SKIPPER_PAUSE_IMAGE"},
		"coredns-tag":       {"SKIPPER_COREDNS_IMAGE"},
		"testpod-tag":       {"SKIPPER_TESTPOD_IMAGE"},
		"httpbin-tag":       {"SKIPPER_HTTPBIN_IMAGE"},
		"source-date-epoch": {"SOURCE_DATE_EPOCH"},
	}
	err := parse(fs, vars, args, getenv, stderr, `Usage: skipper-image build [flags]

Writes five images as an OCI image layout in --out and prints each one's
reference, digest and size:
  --tag          skipper-controller, skipper-noderouter, skipper-echo and
                 skipper-agent from --bin at /<binary>, mode 0755, owned
                 by root; user 65532:65532, entrypoint
                 /skipper-controller (as the Dockerfile's image)
  --pause-tag    skipper-pause from --bin at /pause; user 65535:65535,
                 entrypoint /pause (the kubelet's sandbox image)
  --coredns-tag  coredns from --bin (make coredns) at /coredns with the file
                 capability cap_net_bind_service=+ep (port 53 as non-root);
                 user 65532:65532, entrypoint /coredns (the cluster DNS)
  --testpod-tag  skipper-testpod from --bin (make build) at /testpod; user
                 65532:65532, entrypoint /testpod (the e2e tests' pods)
  --httpbin-tag  go-httpbin from --bin (make httpbin) at /go-httpbin; user
                 65532:65532, entrypoint /go-httpbin (a third-party
                 function, deploy/examples/protocols)
One layer each, no base image, linux on this machine's architecture.
`)
	if err != nil {
		return c, err
	}
	return c, c.Validate()
}

// ParseServeConfig reads serve's flags, as ParseBuildConfig does.
func ParseServeConfig(args []string, getenv func(string) (string, bool), stderr io.Writer) (ServeConfig, error) {
	c := DefaultServeConfig()
	fs := newFlagSet("serve")
	fs.StringVar(&c.Addr, "addr", c.Addr, "host:port the registry listens on (port 0: any free port, printed once serving)")
	fs.StringVar(&c.Layout, "layout", c.Layout, "directory of the OCI image layout whose images are served (skipper-image build --out)")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", c.ShutdownTimeout, "how long SIGINT or SIGTERM waits for pulls in flight before closing their connections")
	vars := flagenv.Vars{
		"addr":             {"SKIPPER_REGISTRY_ADDR"},
		"layout":           {"SKIPPER_IMAGE_LAYOUT"},
		"shutdown-timeout": {"SKIPPER_REGISTRY_SHUTDOWN_TIMEOUT"},
	}
	err := parse(fs, vars, args, getenv, stderr, `Usage: skipper-image serve [flags]

Serves a registry (go-containerregistry's, over plain HTTP, blobs and
manifests in memory) on --addr, pushes every image of --layout into it under
its repository and tag (ghcr.io/skipper-dev/skipper:dev is served as
<addr>/skipper-dev/skipper:dev), prints each one's reference and digest
there, then serves until SIGINT or SIGTERM. Pushes by others are accepted
and kept in memory only.
`)
	if err != nil {
		return c, err
	}
	return c, c.Validate()
}

func newFlagSet(command string) *flag.FlagSet {
	fs := flag.NewFlagSet("skipper-image "+command, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// parse applies args, then the environment, by flagenv's rules; on --help
// it writes head and the flags to w and returns flag.ErrHelp.
func parse(fs *flag.FlagSet, vars flagenv.Vars, args []string, getenv func(string) (string, bool), w io.Writer, head string) error {
	err := flagenv.Parse(fs, vars, args, getenv)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(w, head)
		fmt.Fprintln(w)
		fmt.Fprintln(w, "Flags (each falls back to the environment variable shown; flags win):")
		flagenv.PrintFlags(w, fs, vars)
	}
	return err
}
