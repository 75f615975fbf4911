package nodeagent

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"skipper.dev/skipper/tests/linuxhost"
)

// containerInitArg is the hidden subcommand the agent re-executes itself
// with to set up a container's mount namespace before exec'ing it.
const containerInitArg = "__skipper_container_init"

// execSpec is what the agent hands the container init over its pipe.
type execSpec struct {
	Path string   `json:"path"`
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	Dir  string   `json:"dir"`
}

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

// startContainer re-executes the agent binary as the container init in a
// new mount namespace (Unshareflags CLONE_NEWNS makes / rprivate) inside the
// pod's network namespace, lets it mount a private tmpfs on /run, moves it
// into the container's cgroups, runs Prepare to write the volumes there,
// then lets it exec the container binary. The process leads its own process
// group and gets SIGKILL when the agent dies.
func startContainer(self string, s startSpec) (*process, error) {
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

	cmd := exec.Command(self, containerInitArg)
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

// RunContainerInit is the container init (the hidden subcommand): it runs in
// the container's fresh mount namespace, mounts a private tmpfs on /run,
// reports "ok" on fd 4, waits for the agent to write the volumes and send
// the exec spec on fd 3, and execs the container binary. It returns only on
// failure.
func RunContainerInit() error {
	ppid := os.Getppid()
	spec := os.NewFile(3, "spec")
	status := os.NewFile(4, "status")
	if spec == nil || status == nil {
		return errors.New("container init: fds 3 and 4 missing (this subcommand is for the node agent only)")
	}
	report := func(err error) error {
		fmt.Fprintf(status, "%v\n", err)
		return err
	}
	// / is already rprivate (Unshareflags); nothing here reaches the host.
	// The copies of the host's mounts under /run go first: hidden under the
	// tmpfs they would still pin what they hold, such as other pods'
	// network namespaces bound under /run/netns.
	if err := detachMountsUnder("/run"); err != nil {
		return report(err)
	}
	if err := unix.Mount("tmpfs", "/run", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=64m"); err != nil {
		return report(fmt.Errorf("mount private /run: %w", err))
	}
	if _, err := fmt.Fprintln(status, "ok"); err != nil {
		return err
	}
	var es execSpec
	if err := json.NewDecoder(spec).Decode(&es); err != nil {
		return report(fmt.Errorf("read exec spec: %w", err))
	}
	spec.Close()
	dir := es.Dir
	if dir == "" {
		dir = "/"
	}
	if err := os.Chdir(dir); err != nil {
		return report(fmt.Errorf("working directory %s: %w", dir, err))
	}
	unix.CloseOnExec(4)
	// The agent's PR_SET_PDEATHSIG belongs to this process's first thread;
	// an exec from another thread of the Go runtime makes that thread the
	// process and drops it, and the container would outlive a killed agent.
	// Set it again on the exec'ing thread, then make sure the agent did not
	// die in between.
	runtime.LockOSThread()
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
		return report(fmt.Errorf("parent-death signal: %w", err))
	}
	if os.Getppid() != ppid {
		return report(errors.New("the node agent died before the container started"))
	}
	err := syscall.Exec(es.Path, es.Argv, es.Env)
	return report(fmt.Errorf("exec %s: %w", es.Path, err))
}

// detachMountsUnder lazily unmounts every mount at or below dir in this
// mount namespace, deepest first.
func detachMountsUnder(dir string) error {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return fmt.Errorf("read mountinfo: %w", err)
	}
	var points []string
	for line := range strings.Lines(string(data)) {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := linuxhost.UnescapeMount(f[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			points = append(points, mp)
		}
	}
	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
	for _, mp := range points {
		if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("detach %s: %w", mp, err)
		}
	}
	return nil
}
