package cluster

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"skipper.dev/skipper/tests/linuxhost"
)

// ProcSpec describes one child process of the cluster.
type ProcSpec struct {
	// Name names the pid file (<state>/<Name>.pid) and log (<state>/logs/<Name>.log).
	Name string
	Path string
	Args []string
	Env  []string
	// Netns, when set, is the named network namespace the child starts in.
	Netns string
	// Cgroup, when set, is a cgroup2 directory the child starts in.
	Cgroup string
	// V1Cgroups are cgroup v1 directories the child is moved into as soon
	// as it started (v1 has no clone-into-cgroup).
	V1Cgroups []string
	// NewMountNS starts the child in a mount namespace of its own.
	NewMountNS bool
}

// Proc is a running child.
type Proc struct {
	Name    string
	Pid     int
	LogPath string
	cmd     *exec.Cmd
	spec    ProcSpec // as started (a restart starts it again)
	done    chan struct{}
	err     error // valid once done is closed
}

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err is the exit error once Done is closed.
func (p *Proc) Err() error { return p.err }

// loggedCommand returns the command that runs path with args and env, its
// stdout and stderr appended to logPath after a line that says what starts
// (what, e.g. "skipper-cluster starting") and how. The caller closes the
// returned log once the child started: the child holds its own copy.
func loggedCommand(name, logPath, what, path string, args, env []string) (*exec.Cmd, *os.File, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, fmt.Errorf("log for %s: %w", name, err)
	}
	fmt.Fprintf(logf, "==== %s %s %s %s\n", time.Now().UTC().Format(time.RFC3339), what, path, strings.Join(args, " "))
	cmd := exec.Command(path, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logf, logf
	return cmd, logf, nil
}

// startProc starts spec in its own process group, killed with SIGKILL if
// this process dies, with stdout and stderr appended to its log, and writes
// its pid file.
func (s State) startProc(spec ProcSpec) (*Proc, error) {
	logPath := s.LogPath(spec.Name)
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return nil, fmt.Errorf("log dir: %w", err)
	}
	cmd, logf, err := loggedCommand(spec.Name, logPath, "skipper-cluster starting", spec.Path, spec.Args, spec.Env)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child holds its own copy
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if spec.NewMountNS {
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWNS
	}
	if spec.Cgroup != "" {
		cg, err := os.Open(spec.Cgroup)
		if err != nil {
			return nil, fmt.Errorf("cgroup for %s: %w", spec.Name, err)
		}
		defer cg.Close()
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = int(cg.Fd())
	}
	start := cmd.Start
	if spec.Netns != "" {
		start = func() error { return linuxhost.InNetns(spec.Netns, cmd.Start) }
	}
	if err := start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", spec.Name, err)
	}
	p := &Proc{Name: spec.Name, Pid: cmd.Process.Pid, LogPath: logPath, cmd: cmd, spec: spec, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	if err := linuxhost.Enter(p.Pid, spec.V1Cgroups); err != nil {
		_ = syscall.Kill(-p.Pid, syscall.SIGKILL)
		<-p.done
		return nil, fmt.Errorf("%s: %w", spec.Name, err)
	}
	if err := writePidFile(s.PidPath(spec.Name), p.Pid); err != nil {
		_ = syscall.Kill(-p.Pid, syscall.SIGKILL)
		<-p.done
		return nil, err
	}
	return p, nil
}

// stop sends SIGTERM to the process group, then SIGKILL after grace.
func (p *Proc) stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-p.Pid, syscall.SIGKILL)
		<-p.done
	}
	// Whatever the leader left in its group goes too.
	_ = syscall.Kill(-p.Pid, syscall.SIGKILL)
}

// pidFile is "<pid> <start time in clock ticks since boot>\n": the start time
// tells a live cluster process from an unrelated one that reused the pid.
func writePidFile(path string, pid int) error {
	st, err := procStartTime(pid)
	if err != nil {
		return fmt.Errorf("pid file %s: %w", path, err)
	}
	data := fmt.Sprintf("%d %d\n", pid, st)
	if err := os.WriteFile(path+".tmp", []byte(data), 0o644); err != nil {
		return fmt.Errorf("pid file: %w", err)
	}
	return os.Rename(path+".tmp", path)
}

// readPidFile returns the pid in path and whether that process still runs.
func readPidFile(path string) (pid int, alive bool, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, false, err
	}
	fields := strings.Fields(string(data))
	if len(fields) == 0 {
		return 0, false, fmt.Errorf("pid file %s is empty", path)
	}
	pid, err = strconv.Atoi(fields[0])
	if err != nil || pid <= 0 {
		return 0, false, fmt.Errorf("pid file %s: bad pid %q", path, fields[0])
	}
	st, err := procStartTime(pid)
	if err != nil {
		return pid, false, nil
	}
	if len(fields) > 1 {
		want, err := strconv.ParseUint(fields[1], 10, 64)
		if err == nil && want != st {
			return pid, false, nil // pid reused by another process
		}
	}
	return pid, !isZombie(pid), nil
}

// procStartTime is field 22 of /proc/<pid>/stat.
func procStartTime(pid int) (uint64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// comm (field 2) may hold spaces and parentheses: split after the last ')'.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	fields := strings.Fields(string(data[i+1:]))
	// fields[0] is field 3 (state); field 22 is fields[19].
	if len(fields) < 20 {
		return 0, fmt.Errorf("/proc/%d/stat: short", pid)
	}
	return strconv.ParseUint(fields[19], 10, 64)
}

func isZombie(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(data, ')')
	return i < 0 || i+2 >= len(data) || data[i+2] == 'Z' || data[i+2] == 'X'
}

// killPid sends SIGTERM to pid's process group (if it leads one) and pid,
// waits up to grace for it to exit, then sends SIGKILL. It works for
// processes that are not our children (down from another shell).
func killPid(pid int, grace time.Duration) {
	signalPid(pid, syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		if !pidAlive(pid) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	signalPid(pid, syscall.SIGKILL)
	for i := 0; i < 100 && pidAlive(pid); i++ {
		time.Sleep(20 * time.Millisecond)
	}
}

func signalPid(pid int, sig syscall.Signal) {
	if pgid, err := syscall.Getpgid(pid); err == nil && pgid == pid {
		_ = syscall.Kill(-pid, sig)
	}
	_ = syscall.Kill(pid, sig)
}

func pidAlive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil {
		return false
	}
	return !isZombie(pid)
}

// tailFile returns the last n lines of path, for error messages.
func tailFile(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
