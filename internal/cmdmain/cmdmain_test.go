package cmdmain

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The test binary runs Main itself when CMDMAIN_TEST names a case.
func TestMain(m *testing.M) {
	switch os.Getenv("CMDMAIN_TEST") {
	case "fail":
		Main("cmd", func(_ context.Context, args []string, getenv func(string) (string, bool), _ io.Writer) error {
			v, _ := getenv("CMDMAIN_VALUE")
			return fmt.Errorf("failed with %s and %s", strings.Join(args, ","), v)
		})
		os.Exit(0) // not reached
	case "help":
		Main("cmd", func(context.Context, []string, func(string) (string, bool), io.Writer) error {
			return fmt.Errorf("config: %w", flag.ErrHelp)
		})
		os.Exit(0) // Main returned, as main then does
	case "signal":
		Main("cmd", func(ctx context.Context, _ []string, _ func(string) (string, bool), stderr io.Writer) error {
			fmt.Fprintln(stderr, "running")
			<-ctx.Done()
			return nil
		})
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func command(t *testing.T, test string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(t.Context(), os.Args[0], args...)
	cmd.Env = append(os.Environ(), "CMDMAIN_TEST="+test, "CMDMAIN_VALUE=v")
	return cmd
}

// TestMainFails: a failing Run gets the arguments and the environment, and
// its error is printed after the command's name, with exit status 1.
func TestMainFails(t *testing.T) {
	t.Parallel()
	out, err := command(t, "fail", "a", "b").CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("exit: %v, want status 1 (output %q)", err, out)
	}
	if want := "cmd: failed with a,b and v\n"; string(out) != want {
		t.Errorf("output %q, want %q", out, want)
	}
}

// TestMainHelpExitsZero: a Run that printed its usage (flag.ErrHelp,
// wrapped) exits 0 and prints nothing more.
func TestMainHelpExitsZero(t *testing.T) {
	t.Parallel()
	out, err := command(t, "help", "--help").CombinedOutput()
	if err != nil || len(out) != 0 {
		t.Fatalf("exit: %v, output %q; want status 0 and no output", err, out)
	}
}

// TestMainStopsOnSIGTERM: SIGTERM ends Run's context, and a Run that then
// returns nil exits 0.
func TestMainStopsOnSIGTERM(t *testing.T) {
	t.Parallel()
	cmd := command(t, "signal")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stderr).ReadString('\n')
	if err != nil || line != "running\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("after SIGTERM: %v, want exit 0", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("still running 30 s after SIGTERM")
	}
}
