package nodeagent

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"skipper.dev/skipper/tests/linuxhost"
	"skipper.dev/skipper/tests/nodeagent/containerinit"
)

// execSpec is what the agent hands the container init over its pipe.
type execSpec = containerinit.ExecSpec

// process is a running container process.
type process struct {
	pid    int
	cmd    *exec.Cmd
	exited chan struct{} // closed after Wait returns
	code   int           // exit code (128+signal when killed), valid after exited
}

// startSpec describes a container process to start.
type startSpec struct {
	Exec    execSpec
	LogPath string
	// Prepare runs after the process has its private /run and before it
	// execs the container binary; root is /proc/<pid>/root.
	Prepare func(pid int, root string) error
	// InitTimeout bounds the handshake with the container init.
	InitTimeout time.Duration
	// Netns is the named network namespace the process starts in; empty:
	// the agent's own (hostNetwork).
	Netns string
	// Cgroups are the cgroup directories (one per hierarchy) the process is
	// moved into before it execs the container binary.
	Cgroups []string
}

// startContainer starts the container init (init: its argv, normally
// bin/skipper-container-init; package containerinit) in a new mount
// namespace (Unshareflags CLONE_NEWNS makes / rprivate) inside the
// pod's network namespace, lets it mount a private tmpfs on /run, moves it
// into the container's cgroups, runs Prepare to write the volumes there,
// then lets it exec the container binary. The process leads its own process
// group and gets SIGKILL when the agent dies.
func startContainer(init []string, s startSpec) (*process, error) {
	if len(init) == 0 {
		return nil, errors.New("start container: no container init")
	}
	logf, err := os.OpenFile(s.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("container log: %w", err)
	}
	defer logf.Close()
	specR, specW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer specR.Close()
	defer specW.Close()
	statusR, statusW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer statusR.Close()
	defer statusW.Close()

	cmd := exec.Command(init[0], init[1:]...)
	cmd.Env = []string{}
	cmd.Dir = "/"
	cmd.Stdin = nil
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = []*os.File{specR, statusW} // fd 3, fd 4
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid:      true,
		Pdeathsig:    syscall.SIGKILL,
		Unshareflags: syscall.CLONE_NEWNS,
	}
	start := cmd.Start
	if s.Netns != "" {
		start = func() error { return linuxhost.InNetns(s.Netns, cmd.Start) }
	}
	if err := start(); err != nil {
		return nil, fmt.Errorf("start container init: %w", err)
	}
	p := &process{pid: cmd.Process.Pid, cmd: cmd, exited: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		p.code = exitCode(cmd.ProcessState, err)
		close(p.exited)
	}()
	specR.Close()
	statusW.Close()
	fail := func(err error) (*process, error) {
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
		<-p.exited
		return nil, err
	}

	deadline := time.Now().Add(s.InitTimeout)
	_ = statusR.SetReadDeadline(deadline)
	br := bufio.NewReader(statusR)
	line, err := br.ReadString('\n')
	if err != nil {
		return fail(fmt.Errorf("container init handshake: %w", err))
	}
	if line = strings.TrimSpace(line); line != "ok" {
		return fail(fmt.Errorf("container init: %s", line))
	}
	if err := linuxhost.Enter(p.pid, s.Cgroups); err != nil {
		return fail(err)
	}
	if s.Prepare != nil {
		if err := s.Prepare(p.pid, fmt.Sprintf("/proc/%d/root", p.pid)); err != nil {
			return fail(err)
		}
	}
	if err := json.NewEncoder(specW).Encode(s.Exec); err != nil {
		return fail(fmt.Errorf("send exec spec: %w", err))
	}
	specW.Close()
	_ = statusR.SetReadDeadline(time.Now().Add(s.InitTimeout))
	// The status pipe is close-on-exec in the init: EOF means the exec
	// succeeded; anything else is the init's error.
	msg, err := io.ReadAll(br)
	if err != nil {
		return fail(fmt.Errorf("container init exec: %w", err))
	}
	if len(msg) > 0 {
		return fail(fmt.Errorf("%s", strings.TrimSpace(string(msg))))
	}
	return p, nil
}

func exitCode(st *os.ProcessState, err error) int {
	if st == nil {
		return -1
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return st.ExitCode()
}

// signal sends sig to the container's process group.
func (p *process) signal(sig syscall.Signal) { _ = syscall.Kill(-p.pid, sig) }

// stop sends SIGTERM, waits up to grace, then SIGKILL, and waits (bounded)
// for the process to be reaped. Whatever else is left in its process group
// is killed too.
func (p *process) stop(grace time.Duration) {
	select {
	case <-p.exited:
		p.signal(syscall.SIGKILL)
		return
	default:
	}
	p.signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(grace):
	}
	p.signal(syscall.SIGKILL)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
	}
}
