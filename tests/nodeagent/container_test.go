package nodeagent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain lets the test binary act as the container init, as the agent
// binary does when it re-executes itself, and checks for leaked goroutines.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == containerInitArg {
		if err := RunContainerInit(); err != nil {
			os.Exit(127)
		}
	}
	goleak.VerifyTestMain(m)
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: mount namespaces")
	}
}

func TestStartContainerPrivateRun(t *testing.T) {
	requireRoot(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(t.TempDir(), "c.log")
	target := "/run/skipper-test-" + strings.ReplaceAll(t.Name(), "/", "_")
	t.Cleanup(func() { os.RemoveAll(target) })
	p, err := startContainer(self, startSpec{
		Exec: execSpec{Path: "/bin/sh", Argv: []string{"sh", "-c", `cat ` + target + `/hello; echo " $GREETING"; pwd`},
			Env: []string{"GREETING=hi"}, Dir: "/tmp"},
		LogPath:     logPath,
		InitTimeout: 10 * time.Second,
		Prepare: func(pid int, root string) error {
			return writeVolume(root, target, map[string][]byte{"hello": []byte("world")})
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	waitExit(t, p)
	if p.code != 0 {
		t.Errorf("exit code %d", p.code)
	}
	out, _ := os.ReadFile(logPath)
	if got, want := string(out), "world hi\n/tmp\n"; got != want {
		t.Errorf("container output %q, want %q", got, want)
	}
	if _, err := os.Stat(target); !os.IsNotExist(err) {
		t.Errorf("%s exists on the host (err %v): the volume leaked out of the pod's mount namespace", target, err)
	}
}

func TestStartContainerExecFailureAndStop(t *testing.T) {
	requireRoot(t)
	self, _ := os.Executable()
	logPath := filepath.Join(t.TempDir(), "c.log")
	if _, err := startContainer(self, startSpec{Exec: execSpec{Path: "/nonexistent/bin", Argv: []string{"x"}}, LogPath: logPath, InitTimeout: 5 * time.Second}); err == nil ||
		!strings.Contains(err.Error(), "exec /nonexistent/bin") {
		t.Errorf("exec failure: got %v", err)
	}
	p, err := startContainer(self, startSpec{Exec: execSpec{Path: "/bin/sleep", Argv: []string{"sleep", "60"}}, LogPath: logPath, InitTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	p.stop(5 * time.Second)
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("stop took %s: sleep should die on SIGTERM", d)
	}
	if p.code != 128+15 {
		t.Errorf("exit code %d, want 143 (SIGTERM)", p.code)
	}
}

// waitExit waits for a container process that should end by itself.
func waitExit(t *testing.T, p *process) {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		p.stop(0)
		t.Fatal("container did not exit")
	}
}
