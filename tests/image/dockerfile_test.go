package image

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// dockerImage is what the Dockerfile says of the image it builds.
type dockerImage struct {
	Binaries   []string // the `go build` line's ./cmd/<binary> packages
	User       string
	Entrypoint []string
}

var (
	goBuildPackages = regexp.MustCompile(`^RUN .*\bgo build\b.*\s-o\s+(\S+)\s+(.*)$`)
	copyToRoot      = regexp.MustCompile(`^COPY\s+--from=\S+\s+(\S+)\s+/$`)
)

// parseDockerfile reads the final stage's USER and ENTRYPOINT (exec form)
// and the binaries of the one `go build` line, checking that the final
// stage copies its output directory to /.
func parseDockerfile(df string) (dockerImage, error) {
	var d dockerImage
	var out string
	var copied []string
	var errs []error
	for l := range strings.Lines(df) {
		l = strings.TrimSpace(l)
		if m := goBuildPackages.FindStringSubmatch(l); m != nil {
			if d.Binaries != nil {
				errs = append(errs, errors.New("more than one RUN go build line"))
			}
			out = m[1]
			d.Binaries = []string{}
			for _, p := range strings.Fields(m[2]) {
				b, ok := strings.CutPrefix(p, "./cmd/")
				if !ok || strings.Contains(b, "/") {
					errs = append(errs, fmt.Errorf("go build package %q: want ./cmd/<binary>", p))
				}
				d.Binaries = append(d.Binaries, b)
			}
		}
		if m := copyToRoot.FindStringSubmatch(l); m != nil {
			copied = append(copied, m[1])
		}
		if u, ok := strings.CutPrefix(l, "USER "); ok {
			d.User = strings.TrimSpace(u)
		}
		if e, ok := strings.CutPrefix(l, "ENTRYPOINT "); ok {
			d.Entrypoint = nil
			if err := json.Unmarshal([]byte(e), &d.Entrypoint); err != nil {
				errs = append(errs, fmt.Errorf("ENTRYPOINT %s: want the exec form: %w", e, err))
			}
		}
	}
	if d.Binaries == nil {
		errs = append(errs, errors.New("no RUN go build ... -o <dir> <packages> line"))
	} else if !slices.Contains(copied, out) {
		errs = append(errs, fmt.Errorf("the final stage does not COPY --from=<build> %s /", out))
	}
	if d.User == "" || d.Entrypoint == nil {
		errs = append(errs, errors.New("no USER or no ENTRYPOINT"))
	}
	return d, errors.Join(errs...)
}

// agree returns why the builder's Skipper image differs from the
// Dockerfile's, or nil.
func agree(df string) error {
	d, err := parseDockerfile(df)
	if err != nil {
		return err
	}
	want := dockerImage{Binaries: SkipperBinaries, User: SkipperUser, Entrypoint: SkipperEntrypoint}
	if diff := cmp.Diff(d, want); diff != "" {
		return fmt.Errorf("(-Dockerfile +skipper-image):\n%s", diff)
	}
	return nil
}

// The image make image builds has the Dockerfile's binaries, user and
// entrypoint (issue 31: the Dockerfile stays for builds elsewhere and a
// test keeps the two in agreement), and every command under cmd/ is one
// of its binaries.
func TestDockerfileAgrees(t *testing.T) {
	b, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	df := string(b)
	if err := agree(df); err != nil {
		t.Fatalf("the Dockerfile and skipper-image build disagree: %v", err)
	}

	cmds, err := os.ReadDir("../../cmd")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cmds {
		if _, err := os.Stat(filepath.Join("../../cmd", c.Name(), "main.go")); err == nil && !slices.Contains(SkipperBinaries, c.Name()) {
			t.Errorf("cmd/%s is not in the image: add it to the Dockerfile's go build line and to SkipperBinaries", c.Name())
		}
	}

	// The check bites: each way the two could drift is caught.
	for _, tc := range []struct {
		name    string
		old, to string
	}{
		{name: "a binary more", old: "./cmd/skipper-echo", to: "./cmd/skipper-echo ./cmd/skipper-extra"},
		{name: "a binary fewer", old: " ./cmd/skipper-echo", to: ""},
		{name: "another user", old: "USER 65532:65532", to: "USER 65534:65534"},
		{name: "another entrypoint", old: `ENTRYPOINT ["/skipper-controller"]`, to: `ENTRYPOINT ["/skipper-noderouter"]`},
		{name: "shell-form entrypoint", old: `ENTRYPOINT ["/skipper-controller"]`, to: `ENTRYPOINT /skipper-controller`},
		{name: "binaries not at /", old: "COPY --from=build /out/ /", to: "COPY --from=build /out/ /usr/bin/"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(df, tc.old) {
				t.Fatalf("the Dockerfile has no %q to change", tc.old)
			}
			if err := agree(strings.Replace(df, tc.old, tc.to, 1)); err == nil {
				t.Errorf("replacing %q with %q went unnoticed", tc.old, tc.to)
			}
		})
	}
}
