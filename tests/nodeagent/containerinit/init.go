// Package containerinit is the node agent's container init: the process
// the agent starts in a container's fresh mount namespace and pod network
// namespace, which mounts the container's private /run, waits for the agent
// to write its volumes and move it into its cgroups, and execs the
// container binary (bin/skipper-container-init).
//
// It is a package and a binary of its own, apart from the agent, because it
// runs once per container start and a Go program pays for its packages'
// initialisation at every start: the agent binary, with client-go's API
// types, took 15–27 ms of CPU and about 1,230 page faults to get as far as
// main on the 2-core VM, against about 2 ms and 200 for a small program
// (docs/benchmarks.md: 2–5 ms and about 220). Keep its imports few.
package containerinit

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"skipper.dev/skipper/tests/linuxhost"
)

// ExecSpec is what the agent hands the container init over its pipe (fd 3).
type ExecSpec struct {
	Path string   `json:"path"`
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	Dir  string   `json:"dir"`
}

// Run is the container init: it runs in
// the container's fresh mount namespace, mounts a private tmpfs on /run,
// reports "ok" on fd 4, waits for the agent to write the volumes and send
// the exec spec on fd 3, and execs the container binary. It returns only on
// failure.
func Run() error {
	ppid := os.Getppid()
	// os.NewFile never fails for fds 3 and 4: check they are open, and
	// that this is a mount namespace of its own (the agent's Unshareflags),
	// before anything under /run is touched. Run by hand in the host's
	// namespace it would detach the host's /run mounts.
	for _, fd := range []int{3, 4} {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
			return fmt.Errorf("container init: fd %d not open (this program is for the node agent only): %w", fd, err)
		}
	}
	spec := os.NewFile(3, "spec")
	status := os.NewFile(4, "status")
	self, err1 := os.Readlink("/proc/self/ns/mnt")
	parent, err2 := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", ppid))
	if err := errors.Join(err1, err2); err != nil || self == parent {
		fmt.Fprintf(status, "container init: not in a mount namespace of its own (%v)\n", err)
		return errors.New("container init: not in a mount namespace of its own (this program is for the node agent only)")
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
	var es ExecSpec
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
