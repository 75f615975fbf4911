package image

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"skipper.dev/skipper/controller/flagenv"
	"skipper.dev/skipper/tests/golden"
)

func TestHelpGolden(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
	}{
		{name: "help.golden", args: []string{"--help"}},
		{name: "build-help.golden", args: []string{"build", "--help"}},
		{name: "serve-help.golden", args: []string{"serve", "--help"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			if err := Run(t.Context(), tc.args, flagenv.Map(nil), &out); err != nil {
				t.Fatal(err)
			}
			golden.Check(t, tc.name, out.Bytes())
		})
	}
}

func TestParseConfig(t *testing.T) {
	t.Parallel()
	t.Run("build defaults", func(t *testing.T) {
		c, err := ParseBuildConfig(nil, flagenv.Map(map[string]string{"SKIPPER_IMAGE": "", "SOURCE_DATE_EPOCH": ""}), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(DefaultBuildConfig(), c); diff != "" {
			t.Errorf("(-want +got):\n%s", diff)
		}
	})
	t.Run("build from env and flags", func(t *testing.T) {
		env := flagenv.Map(map[string]string{
			"SOURCE_DATE_EPOCH":     "1700000000",
			"SKIPPER_IMAGE":         "198.51.100.1:5000/skipper-dev/skipper:env",
			"SKIPPER_COREDNS_IMAGE": "198.51.100.1:5000/skipper-dev/coredns:env",
		})
		c, err := ParseBuildConfig([]string{"--bin", "b", "--out", "o", "--tag", "198.51.100.1:5000/skipper-dev/skipper:flag"}, env, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		want := BuildConfig{Bin: "b", Out: "o", Tag: "198.51.100.1:5000/skipper-dev/skipper:flag",
			PauseTag: DefaultBuildConfig().PauseTag, CoreDNSTag: "198.51.100.1:5000/skipper-dev/coredns:env", TestPodTag: DefaultBuildConfig().TestPodTag, HTTPBinTag: DefaultBuildConfig().HTTPBinTag, SourceDateEpoch: 1700000000}
		if diff := cmp.Diff(want, c); diff != "" {
			t.Errorf("(-want +got):\n%s", diff)
		}
	})
	t.Run("serve from env", func(t *testing.T) {
		env := flagenv.Map(map[string]string{"SKIPPER_REGISTRY_SHUTDOWN_TIMEOUT": "2s"})
		c, err := ParseServeConfig([]string{"--addr", "198.51.100.1:5000"}, env, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		want := ServeConfig{Addr: "198.51.100.1:5000", Layout: "bin/image", ShutdownTimeout: 2 * time.Second}
		if diff := cmp.Diff(want, c); diff != "" {
			t.Errorf("(-want +got):\n%s", diff)
		}
	})
	for _, tc := range []struct {
		name  string
		serve bool
		args  []string
		env   map[string]string
		want  []string // in the error, each
	}{
		{name: "no registry in tag", args: []string{"--tag", "skipper:dev"}, want: []string{"--tag"}},
		{name: "no tag", args: []string{"--pause-tag", "ghcr.io/skipper-dev/pause"}, want: []string{"--pause-tag"}},
		{name: "no registry in coredns tag", args: []string{"--coredns-tag", "coredns:dev"}, want: []string{"--coredns-tag"}},
		{name: "same tags", args: []string{"--pause-tag", "ghcr.io/skipper-dev/skipper:dev"}, want: []string{"--tag and --pause-tag are both"}},
		{name: "same tags, coredns", args: []string{"--coredns-tag", "ghcr.io/skipper-dev/pause:dev"}, want: []string{"--pause-tag and --coredns-tag are both"}},
		{name: "every problem at once", args: []string{"--bin", "", "--out", "", "--source-date-epoch", "-1"},
			want: []string{"--bin", "--out", "--source-date-epoch"}},
		{name: "stray argument", args: []string{"extra"}, want: []string{"unexpected"}},
		{name: "bad env", env: map[string]string{"SOURCE_DATE_EPOCH": "yesterday"}, want: []string{`invalid value "yesterday" for flag --source-date-epoch from SOURCE_DATE_EPOCH`}},
		{name: "serve: bad addr and timeout", serve: true, args: []string{"--addr", "5000", "--shutdown-timeout", "0s"},
			want: []string{"--addr", "--shutdown-timeout"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.serve {
				_, err = ParseServeConfig(tc.args, flagenv.Map(tc.env), io.Discard)
			} else {
				_, err = ParseBuildConfig(tc.args, flagenv.Map(tc.env), io.Discard)
			}
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// Every image's binaries are required: without one (bin/coredns before
// make coredns) build fails, names the file, and writes no layout.
func TestBuildNeedsEveryBinary(t *testing.T) {
	for _, missing := range allBins() {
		t.Run(missing, func(t *testing.T) {
			c := DefaultBuildConfig()
			c.Bin = fakeBin(t, slices.DeleteFunc(allBins(), func(b string) bool { return b == missing })...)
			c.Out = filepath.Join(t.TempDir(), "image")
			_, err := Build(t.Context(), c)
			if err == nil {
				t.Fatal("built without " + missing)
			}
			if !strings.Contains(err.Error(), filepath.Join(c.Bin, missing)) {
				t.Errorf("error %q does not name %s", err, filepath.Join(c.Bin, missing))
			}
			if _, err := os.Stat(c.Out); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("layout %s: %v, want none written", c.Out, err)
			}
		})
	}
}

// lines is an io.Writer that hands each complete line to a channel as
// well as keeping it.
type lines struct {
	mu   sync.Mutex
	buf  []byte
	all  strings.Builder
	sent chan string
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all.Write(p)
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		select {
		case l.sent <- string(l.buf[:i]):
		default: // nobody waiting for more
		}
		l.buf = l.buf[i+1:]
	}
}

func (l *lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.all.String()
}

var (
	builtLine   = regexp.MustCompile(`msg=image ref=(\S+) digest=(\S+) size=(\d+)`)
	servingLine = regexp.MustCompile(`msg=serving addr=(\S+)`)
)

// The command end to end on loopback: build from small fake binaries,
// serve on 127.0.0.1:0, pull each image with go-containerregistry's
// remote package: the digests are the layout's.
func TestBuildServePull(t *testing.T) {
	bin := fakeBin(t, allBins()...)
	out := filepath.Join(t.TempDir(), "image")
	var built bytes.Buffer
	if err := Run(t.Context(), []string{"build", "--bin", bin, "--out", out}, flagenv.Map(nil), &built); err != nil {
		t.Fatalf("build: %v\n%s", err, built.String())
	}
	want := map[string]string{} // repository:tag -> digest
	for _, m := range builtLine.FindAllStringSubmatch(built.String(), -1) {
		ref, err := name.NewTag(m[1])
		if err != nil {
			t.Fatal(err)
		}
		want[ref.RepositoryStr()+":"+ref.TagStr()] = m[2]
	}
	if len(want) != 5 {
		t.Fatalf("build printed %d images, want 5:\n%s", len(want), built.String())
	}

	ctx, cancel := context.WithCancel(t.Context())
	w := &lines{sent: make(chan string, 64)}
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, []string{"serve", "--addr", "127.0.0.1:0", "--layout", out}, flagenv.Map(nil), w)
	}()
	var addr string
	for addr == "" {
		select {
		case l := <-w.sent:
			if m := servingLine.FindStringSubmatch(l); m != nil {
				addr = m[1]
			}
		case err := <-done:
			cancel()
			t.Fatalf("serve ended before serving: %v\n%s", err, w.String())
		case <-time.After(30 * time.Second):
			cancel()
			<-done
			t.Fatalf("serve printed no serving line in 30s:\n%s", w.String())
		}
	}

	tr := remote.DefaultTransport.(*http.Transport).Clone()
	got := map[string]string{}
	for repoTag := range want {
		ref, err := name.NewTag(addr+"/"+repoTag, name.StrictValidation)
		if err != nil {
			t.Fatal(err)
		}
		img, err := remote.Image(ref, remote.WithContext(ctx), remote.WithTransport(tr))
		if err != nil {
			t.Fatalf("pull %s: %v", ref, err)
		}
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		// Read every layer through (the reader checks the digest at its
		// end): the registry serves the blobs too.
		layers, err := img.Layers()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range layers {
			rc, err := l.Compressed()
			if err != nil {
				t.Fatalf("pull %s layer: %v", ref, err)
			}
			if _, err := io.Copy(io.Discard, rc); err != nil {
				t.Fatalf("pull %s layer: %v", ref, err)
			}
			rc.Close()
		}
		got[repoTag] = d.String()
	}
	tr.CloseIdleConnections()
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("pulled digests (-built +pulled):\n%s", diff)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("serve after cancel: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not end within 10s of its context")
	}
}
