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

	"skipper.dev/skipper/tests/nodeagent/containerinit"
)

// containerInitArg makes the test binary the container init
// (bin/skipper-container-init's own code, package containerinit), so that
// these tests need no built binary.
const containerInitArg = "__skipper_container_init"

// testInit is the container init's argv for startContainer in tests.
func testInit(t testing.TB) []string {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return []string{self, containerInitArg}
}

// TestMain lets the test binary act as the container init and checks for
// leaked goroutines.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == containerInitArg {
		if err := containerinit.Run(); err != nil {
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
	logPath := filepath.Join(t.TempDir(), "c.log")
	target := "/run/skipper-test-" + strings.ReplaceAll(t.Name(), "/", "_")
	t.Cleanup(func() { os.RemoveAll(target) })
	p, err := startContainer(testInit(t), startSpec{
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
	logPath := filepath.Join(t.TempDir(), "c.log")
	if _, err := startContainer(testInit(t), startSpec{Exec: execSpec{Path: "/nonexistent/bin", Argv: []string{"x"}}, LogPath: logPath, InitTimeout: 5 * time.Second}); err == nil ||
		!strings.Contains(err.Error(), "exec /nonexistent/bin") {
		t.Errorf("exec failure: got %v", err)
	}
	p, err := startContainer(testInit(t), startSpec{Exec: execSpec{Path: "/bin/sleep", Argv: []string{"sleep", "60"}}, LogPath: logPath, InitTimeout: 5 * time.Second})
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
	p, err := startContainer([]string{self, containerInitArg}, startSpec{Exec: execSpec{Path: "/bin/sleep", Argv: []string{"sleep", "60"}},
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

// TestContainerInitPath: the container init is found next to the agent, or
// where --container-init says; a missing or non-executable one is an error
// that says how to get it.
func TestContainerInitPath(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "init")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := containerInit(exe); err != nil || got != exe {
		t.Errorf("containerInit(%q) = %q, %v; want it back", exe, got, err)
	}
	for _, bad := range []string{filepath.Join(dir, "missing"), plain, dir} {
		if got, err := containerInit(bad); err == nil {
			t.Errorf("containerInit(%q) = %q; want an error", bad, got)
		}
	}
	if _, err := containerInit(filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "make build") {
		t.Errorf("a missing init's error should say how to build it: %v", err)
	}
	// The default is skipper-container-init beside the running binary (here
	// the test binary, which has none beside it).
	self, _ := os.Executable()
	want := filepath.Join(filepath.Dir(self), "skipper-container-init")
	if _, err := containerInit(""); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("default: got %v, want an error naming %s", err, want)
	}
}
