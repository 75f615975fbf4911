package cluster

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrNoCgroup2 is returned when no cgroup2 filesystem is mounted.
var ErrNoCgroup2 = errors.New("no cgroup2 filesystem mounted")

// Cgroup2Mount returns the mount point of the cgroup2 hierarchy, read from
// /proc/mounts (pure cgroup v2 at /sys/fs/cgroup, or hybrid at
// /sys/fs/cgroup/unified; never assumed).
func Cgroup2Mount() (string, error) {
	f, err := os.Open("/proc/mounts")
	if err != nil {
		return "", fmt.Errorf("read mounts: %w", err)
	}
	defer f.Close()
	return parseCgroup2Mount(f)
}

func parseCgroup2Mount(r io.Reader) (string, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 3 && fields[2] == "cgroup2" {
			return unescapeMount(fields[1]), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("read mounts: %w", err)
	}
	return "", ErrNoCgroup2
}

// unescapeMount undoes the octal escapes (\040 for space) of /proc/mounts.
func unescapeMount(s string) string {
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

// CgroupRoot is the cluster's cgroup directory, <cgroup2>/<name>; node N's
// cgroup is CgroupRoot/node<N>.
type CgroupRoot string

// Node returns node n's cgroup directory.
func (c CgroupRoot) Node(n int) string { return filepath.Join(string(c), NodeName(n)) }

// Ensure creates the cluster's and node 1..nodes' cgroups (existing ones kept).
func (c CgroupRoot) Ensure(nodes int) error {
	for n := 1; n <= nodes; n++ {
		if err := os.MkdirAll(c.Node(n), 0o755); err != nil {
			return fmt.Errorf("cgroup %s: %w", c.Node(n), err)
		}
	}
	return nil
}

// Remove kills every process in the cluster's cgroups and removes them,
// deepest first. A missing root is fine.
func (c CgroupRoot) Remove(timeout time.Duration) error {
	var dirs []string
	err := filepath.WalkDir(string(c), func(path string, d os.DirEntry, err error) error {
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
		return fmt.Errorf("walk %s: %w", c, err)
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
		// cgroup.kill (5.14+) kills the whole subtree atomically; fall back
		// to signalling each member.
		if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0o644); err != nil {
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
