package linuxhost

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
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
// holding one of PodControllers, read from /proc/mounts (pure cgroup v2 at
// /sys/fs/cgroup, or hybrid with cgroup2 at /sys/fs/cgroup/unified; never
// assumed). It fails with ErrNoCgroup2 when cgroup2 is not mounted.
func Hierarchies() ([]Hierarchy, error) {
	f, err := os.Open("/proc/mounts")
	if err != nil {
		return nil, fmt.Errorf("read mounts: %w", err)
	}
	defer f.Close()
	return ParseHierarchies(f)
}

// AllHierarchies is Hierarchies with every mounted v1 hierarchy, not only
// those of PodControllers (devices, freezer, blkio, name=systemd, ...):
// runc and the kubelet make a container's cgroup in each, so whoever
// removes a tree of them must walk them all. A v1 hierarchy's Controllers
// are its mount options naming a controller or a name=.
func AllHierarchies() ([]Hierarchy, error) {
	f, err := os.Open("/proc/mounts")
	if err != nil {
		return nil, fmt.Errorf("read mounts: %w", err)
	}
	defer f.Close()
	return parseHierarchies(f, isController)
}

// isController reports whether a cgroup v1 mount option names what the
// hierarchy holds (a controller, or name=), not a mount flag.
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

// ParseHierarchies is Hierarchies on a /proc/mounts text. A hierarchy
// mounted twice is listed once, at its first mount point.
func ParseHierarchies(r io.Reader) ([]Hierarchy, error) {
	return parseHierarchies(r, func(opt string) bool { return slices.Contains(PodControllers, opt) })
}

// parseHierarchies lists cgroup2 first, then each v1 hierarchy with an
// option keep accepts (the options kept as its Controllers).
func parseHierarchies(r io.Reader, keep func(opt string) bool) ([]Hierarchy, error) {
	var v2 string
	var v1 []Hierarchy
	seen := map[string]bool{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 4 {
			continue
		}
		switch fields[2] {
		case "cgroup2":
			if v2 == "" {
				v2 = UnescapeMount(fields[1])
			}
		case "cgroup":
			var ctrls []string
			for _, opt := range strings.Split(fields[3], ",") {
				if keep(opt) {
					ctrls = append(ctrls, opt)
				}
			}
			key := strings.Join(ctrls, ",")
			if len(ctrls) == 0 || seen[key] {
				continue
			}
			seen[key] = true
			v1 = append(v1, Hierarchy{Mount: UnescapeMount(fields[1]), Controllers: ctrls})
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mounts: %w", err)
	}
	if v2 == "" {
		return nil, ErrNoCgroup2
	}
	return append([]Hierarchy{{Mount: v2}}, v1...), nil
}

// UnescapeMount undoes the octal escapes (\040 for space) of /proc/mounts
// and /proc/self/mountinfo.
func UnescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
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
