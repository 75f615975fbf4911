package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const root = "../.."

func read(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// makeVar returns the value of a `NAME := value` line of the Makefile.
func makeVar(t *testing.T, makefile, name string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + name + `\s*:=\s*(.*)$`).FindStringSubmatch(makefile)
	if m == nil {
		t.Fatalf("Makefile has no %s := line", name)
	}
	return strings.TrimSpace(m[1])
}

// goBuild is one `go build` command line: environment, flags, packages.
type goBuild struct {
	Env      []string
	Flags    string
	Packages []string
}

var buildLine = regexp.MustCompile(`((?:[A-Z_]+=\S+\s+)*)go build\s+(.*?)\s+-o\s+\S+\s+(.*)$`)

func parseBuild(t *testing.T, where, line string) goBuild {
	t.Helper()
	m := buildLine.FindStringSubmatch(strings.TrimSpace(line))
	if m == nil {
		t.Fatalf("%s: no `go build ... -o <dir> <packages>` in %q", where, line)
	}
	return goBuild{Env: strings.Fields(m[1]), Flags: m[2], Packages: strings.Fields(m[3])}
}

// The image's binaries are built exactly as `make build` builds them: the
// same packages, flags and CGO setting, and the build stage copies every
// directory of the module those packages import.
func TestDockerfileBuildsLikeMake(t *testing.T) {
	mk, df := read(t, "Makefile"), read(t, "Dockerfile")
	var bins []string
	for _, b := range strings.Fields(makeVar(t, mk, "SKIPPER_BINS")) {
		bins = append(bins, "./cmd/"+b)
	}
	want := goBuild{Env: []string{"CGO_ENABLED=0"}, Flags: makeVar(t, mk, "BUILD_FLAGS"), Packages: bins}

	// The Makefile's own line, with its variables expanded.
	var makeLine string
	for _, l := range strings.Split(mk, "\n") {
		if strings.Contains(l, "$(addprefix ./cmd/,$(SKIPPER_BINS))") {
			makeLine = l
		}
	}
	if makeLine == "" {
		t.Fatal("Makefile: no build line for $(SKIPPER_BINS)")
	}
	makeLine = strings.NewReplacer("$(GO)", "go", "$(BUILD_FLAGS)", want.Flags, "$(BIN)/", "bin/",
		"$(addprefix ./cmd/,$(SKIPPER_BINS))", strings.Join(bins, " ")).Replace(makeLine)
	got := parseBuild(t, "Makefile", makeLine)
	// -v only lists packages as they are built (make's progress line counts
	// them); it changes nothing in the binaries.
	got.Flags = strings.TrimPrefix(got.Flags, "-v ")
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Makefile build (-want +got):\n%s", diff)
	}

	var runs []string
	for _, l := range strings.Split(df, "\n") {
		if strings.HasPrefix(l, "RUN ") && strings.Contains(l, "go build") {
			runs = append(runs, strings.TrimPrefix(l, "RUN "))
		}
	}
	if len(runs) != 1 {
		t.Fatalf("Dockerfile has %d RUN go build lines, want 1", len(runs))
	}
	if diff := cmp.Diff(want, parseBuild(t, "Dockerfile", runs[0])); diff != "" {
		t.Errorf("Dockerfile build differs from make build (-want +got):\n%s", diff)
	}

	// Every module directory the binaries depend on is copied into the
	// build stage.
	list := exec.Command("go", append([]string{"list", "-deps", "-f", "{{if .Module}}{{if .Module.Main}}{{.ImportPath}}{{end}}{{end}}"}, bins...)...)
	list.Dir = root
	out, err := list.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	copied := regexp.MustCompile(`(?m)^COPY\s+(\S+)\s+\./`).FindAllStringSubmatch(df, -1)
	var dirs []string
	for _, c := range copied {
		dirs = append(dirs, c[1])
	}
	for _, pkg := range strings.Fields(string(out)) {
		top, _, _ := strings.Cut(strings.TrimPrefix(pkg, "skipper.dev/skipper/"), "/")
		if !slices.Contains(dirs, top) {
			t.Errorf("the binaries import %s but the Dockerfile does not COPY %s (copies %v)", pkg, top, dirs)
		}
	}
	if !strings.Contains(df, "gcr.io/distroless/static") || !strings.Contains(df, "USER 65532") {
		t.Error("the final stage must be distroless/static and non-root")
	}
}
