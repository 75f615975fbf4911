package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// helperEnv makes the test binary act as the process under test:
// "pause" starts a child that exits at once, prints its pid, then runs
// main; "exit" exits 0 (the child).
const helperEnv = "SKIPPER_PAUSE_TEST_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "exit":
		os.Exit(0)
	case "pause":
		self, err := os.Executable()
		var child *os.Process
		if err == nil {
			// Not waited for: it stays a zombie until main reaps it.
			child, err = os.StartProcess(self, []string{self}, &os.ProcAttr{Env: []string{helperEnv + "=exit", "GORACE=" + os.Getenv("GORACE")}})
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "start child:", err)
			os.Exit(3)
		}
		fmt.Println(child.Pid)
		main()
		os.Exit(4) // main returned: it never should
	}
	os.Exit(m.Run())
}

func TestPause(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			cmd := exec.Command(os.Args[0])
			// GORACE: under -race, a process sleeps 1s at exit by default.
			cmd.Env = append(os.Environ(), helperEnv+"=pause", "GORACE=atexit_sleep_ms=0")
			cmd.Stderr = os.Stderr
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			var child int
			if _, err := fmt.Fscan(stdout, &child); err != nil {
				t.Fatalf("read the child's pid: %v", err)
			}

			// The child exits at once and stays a zombie until reaped,
			// which main does only once its handlers are installed: a
			// signal sent after that is main's to handle.
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) { // sleep: poll (a nested module: no internal/poll)
				if _, err := os.Stat(fmt.Sprintf("/proc/%d", child)); errors.Is(err, os.ErrNotExist) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("exited child %d not reaped within 10s", child)
				}
			}

			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			if err := cmd.Wait(); err != nil {
				t.Fatalf("after %s: %v, want exit status 0", sig, err)
			}
		})
	}
}
