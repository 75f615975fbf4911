package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"skipper.dev/skipper/tests/linuxhost"
)

// nodeProcPrefix names each node process ("skipper-node-node1").
const nodeProcPrefix = "skipper-node-"

// nodeSocketTimeout bounds the wait for a daemon's socket.
const nodeSocketTimeout = 90 * time.Second

// RunNode is `skipper-cluster node --spec FILE`: the process that is one
// node. Up starts it in the node's network namespace and system cgroup,
// in a mount namespace of its own (CLONE_NEWNS). It makes the spec's
// mounts there, sets its sysctls, starts its daemons in order (containerd,
// then the kubelet) and is the subreaper of everything they start (the
// runc shims daemonise), until ctx ends or a daemon exits. Then it stops
// the daemons in reverse order, kills what is left in the node's pod
// cgroups and every orphan, and returns; the mount namespace, and every
// mount in it (pod network namespaces, volumes, container root
// filesystems), goes with the last process in it.
func RunNode(ctx context.Context, specPath string, log *slog.Logger) error {
	data, err := os.ReadFile(specPath)
	if err != nil {
		return fmt.Errorf("node spec: %w", err)
	}
	var spec NodeSpec
	if err := json.Unmarshal(data, &spec); err != nil {
		return fmt.Errorf("node spec %s: %w", specPath, err)
	}
	grace, err := time.ParseDuration(string(spec.StopTimeout))
	if err != nil {
		return fmt.Errorf("node spec %s: stopTimeout: %w", specPath, err)
	}
	log = log.With("node", spec.Name)
	if err := linuxhost.Enter(os.Getpid(), spec.V1Cgroups); err != nil {
		return err
	}
	if err := setupNodeMounts(spec.Mounts); err != nil {
		return err
	}
	for _, k := range sortedKeys(spec.Sysctls) {
		if err := os.WriteFile("/proc/sys/"+k, []byte(spec.Sysctls[k]), 0o644); err != nil {
			return fmt.Errorf("sysctl %s: %w", k, err)
		}
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("become subreaper: %w", err)
	}
	r := newReaper()
	defer r.stop()

	var running []*nodeChild
	defer func() {
		for i := len(running) - 1; i >= 0; i-- {
			d := running[i]
			log.Info("stopping", "daemon", d.name)
			d.stop(grace)
			if d.name == "kubelet" {
				// What the kubelet left running: its pods' containers.
				killCgroupTrees(spec.PodCgroups, grace)
			}
		}
		// The shims (reparented here) and anything else left.
		r.killOrphans(grace)
	}()
	for _, d := range spec.Daemons {
		c, err := startNodeDaemon(r, d, filepath.Join(spec.LogDir, spec.Name+"-"+d.Name+".log"))
		if err != nil {
			return err
		}
		running = append(running, c)
		log.Info("started", "daemon", d.Name, "pid", c.pid)
		if d.Socket != "" {
			if err := waitSocket(ctx, d.Socket, c, nodeSocketTimeout); err != nil {
				return err
			}
		}
	}
	died := make(chan *nodeChild, len(running))
	for _, c := range running {
		go func() {
			<-c.done
			died <- c
		}()
	}
	select {
	case <-ctx.Done():
		return nil
	case c := <-died:
		return fmt.Errorf("%s exited unexpectedly (%s); see %s", c.name, c.status(), c.logPath)
	}
}

// setupNodeMounts makes the node's mount namespace. Every mount is first
// made a slave (what the machine shares still reaches the node, nothing
// goes back), then shared within the node: a container's hostPath mount
// with HostToContainer propagation (the router's bpffs) needs a shared or
// slave source, and every mount on this machine is private, which a
// slave of nothing stays.
func setupNodeMounts(mounts []NodeMount) error {
	for _, flag := range []uintptr{unix.MS_SLAVE, unix.MS_SHARED} {
		if err := unix.Mount("", "/", "", unix.MS_REC|flag, ""); err != nil {
			return fmt.Errorf("mount propagation of /: %w (is the node process in a mount namespace of its own?)", err)
		}
	}
	for _, m := range mounts {
		if m.Source == "" {
			if err := os.MkdirAll(m.Target, 0o755); err != nil {
				return fmt.Errorf("mount point %s: %w", m.Target, err)
			}
			if err := unix.Mount("tmpfs", m.Target, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
				return fmt.Errorf("tmpfs on %s: %w", m.Target, err)
			}
			continue
		}
		st, err := os.Stat(m.Source)
		switch {
		case errors.Is(err, os.ErrNotExist):
			if err := os.MkdirAll(m.Source, 0o755); err != nil {
				return fmt.Errorf("mount source %s: %w", m.Source, err)
			}
		case err != nil:
			return fmt.Errorf("mount source %s: %w", m.Source, err)
		}
		if st == nil || st.IsDir() {
			if err := os.MkdirAll(m.Target, 0o755); err != nil {
				return fmt.Errorf("mount point %s: %w", m.Target, err)
			}
		}
		if err := unix.Mount(m.Source, m.Target, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s on %s: %w", m.Source, m.Target, err)
		}
	}
	return nil
}

// nodeChild is a daemon the node process started.
type nodeChild struct {
	name    string
	pid     int
	logPath string
	done    chan struct{}
	ws      unix.WaitStatus // valid once done is closed
}

func (c *nodeChild) status() string {
	if c.ws.Signaled() {
		return "signal " + c.ws.Signal().String()
	}
	return "exit status " + strconv.Itoa(c.ws.ExitStatus())
}

// stop sends SIGTERM, then SIGKILL after grace, and waits for the exit.
func (c *nodeChild) stop(grace time.Duration) {
	select {
	case <-c.done:
		return
	default:
	}
	_ = syscall.Kill(c.pid, syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(grace):
		_ = syscall.Kill(c.pid, syscall.SIGKILL)
		<-c.done
	}
}

func startNodeDaemon(r *reaper, d NodeDaemon, logPath string) (*nodeChild, error) {
	cmd, logf, err := loggedCommand(d.Name, logPath, "skipper-cluster node starting", d.Path, d.Args, d.Env)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child holds its own copy
	// A process group of its own: the cluster signals the node process's
	// group on stop (Proc.stop), and the node process, not that signal,
	// orders the daemons' stops (the kubelet, its pods, then containerd).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	c := &nodeChild{name: d.Name, logPath: logPath, done: make(chan struct{})}
	// The reaper must know the pid before it can be reaped.
	r.mu.Lock()
	err = cmd.Start()
	if err == nil {
		c.pid = cmd.Process.Pid
		r.children[c.pid] = c
	}
	r.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", d.Name, err)
	}
	// Reaped by the reaper's wait4, never by cmd.Wait: drop the handle.
	_ = cmd.Process.Release()
	return c, nil
}

// waitSocket waits until path accepts a unix connection.
func waitSocket(ctx context.Context, path string, c *nodeChild, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		conn, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			conn.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %s not served after %s (%v); see %s", c.name, path, timeout, err, c.logPath)
		}
		select {
		case <-c.done:
			return fmt.Errorf("%s exited (%s) before serving %s; see %s", c.name, c.status(), path, c.logPath)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// reaper waits for every child of the node process: its daemons (whose
// exits it reports) and the orphans reparented to it as subreaper. It is
// the only caller of wait4, so no exit is taken from under another.
type reaper struct {
	mu       sync.Mutex
	children map[int]*nodeChild
	sigs     chan os.Signal
	quit     chan struct{}
	wg       sync.WaitGroup
}

func newReaper() *reaper {
	r := &reaper{children: map[int]*nodeChild{}, sigs: make(chan os.Signal, 1), quit: make(chan struct{})}
	signal.Notify(r.sigs, syscall.SIGCHLD)
	r.wg.Go(func() {
		tick := time.NewTicker(time.Second) // a SIGCHLD coalesced away is caught here
		defer tick.Stop()
		for {
			r.reap()
			select {
			case <-r.quit:
				return
			case <-r.sigs:
			case <-tick.C:
			}
		}
	})
	return r
}

// reap collects every exited child.
func (r *reaper) reap() {
	for {
		var ws unix.WaitStatus
		r.mu.Lock()
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if pid > 0 {
			if c := r.children[pid]; c != nil {
				delete(r.children, pid)
				c.ws = ws
				close(c.done)
			}
		}
		r.mu.Unlock()
		if pid <= 0 || err != nil {
			return
		}
	}
}

func (r *reaper) stop() {
	signal.Stop(r.sigs)
	close(r.quit)
	r.wg.Wait()
}

// killOrphans kills every remaining child of the node process (the shims,
// reparented to it) and reaps them, for up to grace.
func (r *reaper) killOrphans(grace time.Duration) {
	deadline := time.Now().Add(grace)
	for {
		kids := childPids()
		if len(kids) == 0 || time.Now().After(deadline) {
			return
		}
		for _, pid := range kids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond)
		r.reap()
	}
}

// childPids lists this process's children (every thread's).
func childPids() []int {
	tasks, _ := filepath.Glob("/proc/self/task/*/children")
	var pids []int
	for _, t := range tasks {
		data, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// killCgroupTrees SIGKILLs every process in the cgroup dirs and their
// descendants until none is left or grace passes. The directories are
// left for the cluster's sweep.
func killCgroupTrees(dirs []string, grace time.Duration) {
	deadline := time.Now().Add(grace)
	for {
		var pids []int
		for _, dir := range dirs {
			_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
				if err != nil || !d.IsDir() {
					return nil
				}
				data, _ := os.ReadFile(filepath.Join(path, "cgroup.procs"))
				for _, f := range strings.Fields(string(data)) {
					if pid, err := strconv.Atoi(f); err == nil && pid != os.Getpid() {
						pids = append(pids, pid)
					}
				}
				return nil
			})
		}
		if len(pids) == 0 || time.Now().After(deadline) {
			return
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
