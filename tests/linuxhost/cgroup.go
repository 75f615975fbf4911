package linuxhost

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/moby/sys/mountinfo"
)

// ErrNoCgroup2 is returned when no cgroup2 filesystem is mounted.
var ErrNoCgroup2 = errors.New("no cgroup2 filesystem mounted")

// PodControllers are the v1 controllers whose hierarchies hold pod cgroups
// (where the machine binds them to v1 rather than cgroup2), as the kubelet's
// cgroupfs driver makes them.
var PodControllers = []string{"cpu", "cpuacct", "memory", "pids"}

// Hierarchy is one mounted cgroup hierarchy.
type Hierarchy struct {
	// Mount is its mount point.
	Mount string
	// Controllers are a v1 hierarchy's controllers (among PodControllers,
	// or every one for AllHierarchies); empty for cgroup2.
	Controllers []string
}

// V2 reports the cgroup2 hierarchy.
func (h Hierarchy) V2() bool { return len(h.Controllers) == 0 }

// Hierarchies returns the cgroup2 hierarchy first, then each v1 hierarchy
// holding one of PodControllers, read from the mount table (pure cgroup v2
// at /sys/fs/cgroup, or hybrid with cgroup2 at /sys/fs/cgroup/unified;
// never assumed). It fails with ErrNoCgroup2 when cgroup2 is not mounted.
func Hierarchies() ([]Hierarchy, error) {
	ms, err := cgroupMounts()
	if err != nil {
		return nil, err
	}
	return HierarchiesOf(ms)
}

// AllHierarchies is Hierarchies with every mounted v1 hierarchy, not only
// those of PodControllers (devices, freezer, blkio, name=systemd, ...):
// runc and the kubelet make a container's cgroup in each, so whoever
// removes a tree of them must walk them all. A v1 hierarchy's Controllers
// are its superblock options naming a controller or a name=.
func AllHierarchies() ([]Hierarchy, error) {
	ms, err := cgroupMounts()
	if err != nil {
		return nil, err
	}
	return hierarchiesOf(ms, isController)
}

// cgroupMounts reads the cgroup and cgroup2 mounts of this process's mount
// namespace.
func cgroupMounts() ([]*mountinfo.Info, error) {
	ms, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup", "cgroup2"))
	if err != nil {
		return nil, fmt.Errorf("read mounts: %w", err)
	}
	return ms, nil
}

// isController reports whether a cgroup v1 superblock option names what
// the hierarchy holds (a controller, or name=), not a mount flag.
func isController(opt string) bool {
	switch opt {
	case "rw", "ro", "relatime", "noatime", "nodiratime", "strictatime", "nosuid", "nodev", "noexec",
		"noprefix", "clone_children", "xattr", "cpuset_v2_mode", "none", "all", "favordynmods":
		return false
	}
	return !strings.HasPrefix(opt, "release_agent=")
}

// Cgroup2Mount returns the mount point of the cgroup2 hierarchy.
func Cgroup2Mount() (string, error) {
	hs, err := Hierarchies()
	if err != nil {
		return "", err
	}
	return hs[0].Mount, nil
}

// HierarchiesOf is Hierarchies on a mount table (mountinfo.GetMounts or
// GetMountsFromReader). A hierarchy mounted twice is listed once, at its
// first mount point.
func HierarchiesOf(mounts []*mountinfo.Info) ([]Hierarchy, error) {
	return hierarchiesOf(mounts, func(opt string) bool { return slices.Contains(PodControllers, opt) })
}

// hierarchiesOf lists cgroup2 first, then each v1 hierarchy with a
// superblock option keep accepts (the options kept as its Controllers).
func hierarchiesOf(mounts []*mountinfo.Info, keep func(opt string) bool) ([]Hierarchy, error) {
	var v2 string
	var v1 []Hierarchy
	seen := map[string]bool{}
	for _, m := range mounts {
		switch m.FSType {
		case "cgroup2":
			if v2 == "" {
				v2 = m.Mountpoint
			}
		case "cgroup":
			var ctrls []string
			for _, opt := range strings.Split(m.VFSOptions, ",") {
				if keep(opt) {
					ctrls = append(ctrls, opt)
				}
			}
			key := strings.Join(ctrls, ",")
			if len(ctrls) == 0 || seen[key] {
				continue
			}
			seen[key] = true
			v1 = append(v1, Hierarchy{Mount: m.Mountpoint, Controllers: ctrls})
		}
	}
	if v2 == "" {
		return nil, ErrNoCgroup2
	}
	return append([]Hierarchy{{Mount: v2}}, v1...), nil
}

// Dirs returns the cgroup rel (a path relative to each hierarchy's root,
// such as /skipper/node1) in every hierarchy, cgroup2 first.
func Dirs(hs []Hierarchy, rel string) []string {
	dirs := make([]string, len(hs))
	for i, h := range hs {
		dirs[i] = filepath.Join(h.Mount, rel)
	}
	return dirs
}

// MakeDirs creates every dir (and its parents); existing ones are kept.
func MakeDirs(dirs []string) error {
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("cgroup %s: %w", d, err)
		}
	}
	return nil
}

// Enter moves pid (the whole process) into every cgroup of dirs.
func Enter(pid int, dirs []string) error {
	for _, d := range dirs {
		if err := writeExisting(filepath.Join(d, "cgroup.procs"), strconv.Itoa(pid)); err != nil {
			return fmt.Errorf("move pid %d into cgroup %s: %w", pid, d, err)
		}
	}
	return nil
}

// InheritCpuset gives every cgroup from the root of the v1 cpuset
// hierarchy mounted at mount down to rel (relative to mount) that has no
// CPU or no memory node yet its parent's: a new v1 cpuset cgroup starts
// with neither, and no process can enter it (nor a child be made usable)
// until it has both. Values already set are kept.
func InheritCpuset(mount, rel string) error {
	dir := mount
	for _, part := range strings.Split(strings.Trim(filepath.Clean(rel), "/"), "/") {
		if part == "" {
			continue
		}
		parent := dir
		dir = filepath.Join(dir, part)
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			cur, err := os.ReadFile(filepath.Join(dir, f))
			if err != nil {
				return fmt.Errorf("cpuset %s: %w", dir, err)
			}
			if strings.TrimSpace(string(cur)) != "" {
				continue
			}
			want, err := os.ReadFile(filepath.Join(parent, f))
			if err != nil {
				return fmt.Errorf("cpuset %s: %w", parent, err)
			}
			if err := writeExisting(filepath.Join(dir, f), strings.TrimSpace(string(want))); err != nil {
				return fmt.Errorf("cpuset %s %s: %w", dir, f, err)
			}
		}
	}
	return nil
}

// RemoveTree kills every process in the cgroup dir and its descendants and
// removes them, deepest first, waiting up to timeout for the kernel to let
// go of each. A missing dir is fine.
func RemoveTree(dir string, timeout time.Duration) error {
	var dirs []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, path)
		}
		return nil
	})
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("walk %s: %w", dir, err)
	}
	var errs []error
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := removeCgroup(dirs[i], timeout); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func removeCgroup(dir string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		pids := cgroupPids(dir)
		if len(pids) == 0 {
			break
		}
		// cgroup.kill (cgroup2, 5.14+) kills the whole subtree atomically;
		// elsewhere each member is signalled.
		if err := writeExisting(filepath.Join(dir, "cgroup.kill"), "1"); err != nil {
			for _, pid := range pids {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s still has processes %v after %s", dir, pids, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for {
		err := syscall.Rmdir(dir)
		if err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		// EBUSY until the kernel has reaped the last member.
		if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("remove cgroup %s: %w", dir, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func cgroupPids(dir string) []int {
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// writeExisting writes to a cgroup file without ever creating one.
func writeExisting(path, value string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	return errors.Join(err, f.Close())
}

// EnableControllers makes those of want that the cgroup2 hierarchy mounted
// at mount offers available in the cgroup rel (relative to mount): it adds
// them to the subtree_control of every ancestor of rel below the root (the
// root is the machine's and left alone). An ancestor holding processes
// refuses (cgroup2's no-internal-processes rule), so whatever runs beside
// the cgroups it enables must sit in a leaf of its own. On a hybrid machine
// whose cgroup2 hierarchy offers none of want, it does nothing.
func EnableControllers(mount, rel string, want []string) error {
	parts := strings.Split(strings.Trim(filepath.ToSlash(rel), "/"), "/")
	dir := mount
	for _, p := range parts[:len(parts)-1] {
		dir = filepath.Join(dir, p)
		data, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
		if err != nil {
			return fmt.Errorf("cgroup %s: %w", dir, err)
		}
		var add []string
		for _, c := range strings.Fields(string(data)) {
			if slices.Contains(want, c) {
				add = append(add, "+"+c)
			}
		}
		if len(add) == 0 {
			return nil // not offered here, so not below either
		}
		if err := writeExisting(filepath.Join(dir, "cgroup.subtree_control"), strings.Join(add, " ")); err != nil {
			return fmt.Errorf("enable %v in cgroup %s: %w", add, dir, err)
		}
	}
	return nil
}
