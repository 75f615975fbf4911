package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// fastproxyBuild says how to build the fasthttp contender's binary.
const fastproxyBuild = "make bench builds it; or: cd tests/fastproxy && CGO_ENABLED=0 go build -o ../../bin/ ."

// loopproxyBuild says how to build the event-loop contender's binary.
const loopproxyBuild = "make bench builds it; or: CGO_ENABLED=0 go build -o bin/ ./tests/loopproxy"

// findFastproxy is the fasthttp contender's binary: flagPath when given,
// else fastproxy next to this binary or on PATH.
func findFastproxy(flagPath string) (string, error) {
	if flagPath == "" {
		return findBuilt(fasthttpKind.binName(), selfDir(), fastproxyBuild)
	}
	if !isExecutable(flagPath) {
		return "", fmt.Errorf("-fastproxy %s: not an executable file (%s)", flagPath, fastproxyBuild)
	}
	return flagPath, nil
}

// findBuilt finds name, a binary this repository builds outside the main
// module (make bench puts it in bin/, beside skipper-bench): in dir first,
// then on PATH. Its error says how to build it (build).
func findBuilt(name, dir, build string) (string, error) {
	if p := filepath.Join(dir, name); dir != "" && isExecutable(p) {
		return p, nil
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	where := "on PATH"
	if dir != "" {
		where = "in " + dir + " or on PATH"
	}
	return "", fmt.Errorf("%s not found %s (%s)", name, where, build)
}

// selfDir is the directory of this executable; "" when unknown.
func selfDir() string {
	self, err := os.Executable()
	if err != nil {
		return ""
	}
	return filepath.Dir(self)
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// benchBinDirs are searched after PATH: nginx and haproxy live in sbin
// directories a non-login root shell may lack.
var benchBinDirs = []string{"/usr/sbin", "/sbin", "/usr/local/sbin"}

// lookBin finds name on PATH or in benchBinDirs.
func lookBin(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range benchBinDirs {
		if p := filepath.Join(d, name); isExecutable(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found", name)
}

// ensureBenchBins finds the binaries the contenders need (wrk always, ip,
// nginx and haproxy when measured). When some are missing it runs
// .ci/install-bench as root, and otherwise says to.
func ensureBenchBins(ctx context.Context, contenders []string, stderr io.Writer) (map[string]string, error) {
	need := []string{"wrk", "ip"}
	for _, n := range []string{"nginx", "haproxy"} {
		if slices.Contains(contenders, n) {
			need = append(need, n)
		}
	}
	find := func() (map[string]string, []string) {
		found, missing := map[string]string{}, []string(nil)
		for _, n := range need {
			if p, err := lookBin(n); err == nil {
				found[n] = p
			} else {
				missing = append(missing, n)
			}
		}
		return found, missing
	}
	found, missing := find()
	if len(missing) == 0 {
		return found, nil
	}
	script := filepath.Join(".ci", "install-bench")
	if top, err := exec.Command("git", "--no-optional-locks", "rev-parse", "--show-toplevel").Output(); err == nil {
		script = filepath.Join(strings.TrimSpace(string(top)), script)
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("missing %s: run `sudo bash %s` (Debian packages wrk, nginx, haproxy)", strings.Join(missing, ", "), script)
	}
	fmt.Fprintf(stderr, "warm: missing %s: running %s\n", strings.Join(missing, ", "), script)
	cmd := exec.CommandContext(ctx, "bash", script)
	cmd.Stdout, cmd.Stderr = stderr, stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s: %w", script, err)
	}
	if found, missing = find(); len(missing) > 0 {
		return nil, fmt.Errorf("still missing after %s: %s", script, strings.Join(missing, ", "))
	}
	return found, nil
}
