package nodeagent

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
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
	if len(os.Args) > 1 && os.Args[1] == testAgentArg {
		runTestAgent()
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

// testAgentArg makes the test binary a stand-in agent that starts one
// container (sleep), prints its pid and dies by SIGKILL.
const testAgentArg = "__skipper_test_agent"

func runTestAgent() {
	self, _ := os.Executable()
	p, err := startContainer(self, startSpec{Exec: execSpec{Path: "/bin/sleep", Argv: []string{"sleep", "60"}},
		LogPath: os.DevNull, InitTimeout: 10 * time.Second,
		// The init blocks on its pipe meanwhile, long enough for the Go
		// scheduler to hand its P on and resume it on another thread, as a
		// real agent fetching volumes does.
		Prepare: func(int, string) error { time.Sleep(50 * time.Millisecond); return nil }})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(p.pid)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}

// TestContainerDiesWithAgent: a container gets SIGKILL when its agent is
// killed, whichever thread of the container init exec'd it.
func TestContainerDiesWithAgent(t *testing.T) {
	requireRoot(t)
	self, _ := os.Executable()
	for i := range 10 {
		out, err := exec.Command(self, testAgentArg).Output()
		if len(out) == 0 {
			t.Fatalf("stand-in agent %d printed no pid: %v", i, err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for procAlive(pid) {
			if time.Now().After(deadline) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				t.Fatalf("run %d: container %d outlived its killed agent", i, pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// procAlive reports a process that exists and is not a zombie.
func procAlive(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(data), ')')
	return i > 0 && i+2 < len(data) && data[i+2] != 'Z' && data[i+2] != 'X'
}
