//go:build linux

package bpf

import (
	"fmt"
	"os"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// cgroupID is the id the kernel reports for a cgroup2 directory: its inode.
func cgroupID(dir string) (uint64, error) {
	if err := requireFS(dir, unix.CGROUP2_SUPER_MAGIC, "cgroup2"); err != nil {
		return 0, err
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return 0, fmt.Errorf("bpf steering: cgroup %s: %w", dir, err)
	}
	return st.Ino, nil
}

func requireFS(path string, magic int64, name string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return fmt.Errorf("bpf steering: %s: %w", path, err)
	}
	if int64(st.Type) != magic {
		return fmt.Errorf("bpf steering: %s is not on %s", path, name)
	}
	return nil
}

// Cgroup2Mount returns the mount point of the first cgroup2 hierarchy in
// the mount table (the unified hierarchy on hybrid hosts).
func Cgroup2Mount() (string, error) {
	ms, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup2"))
	if err != nil {
		return "", fmt.Errorf("bpf steering: read mounts: %w", err)
	}
	if len(ms) == 0 {
		return "", &NotSupportedError{Feature: "a mounted cgroup2 hierarchy", Err: ErrNotSupported}
	}
	return ms[0].Mountpoint, nil
}

// EnsureBPFFS mounts bpffs at dir unless one is mounted there already.
func EnsureBPFFS(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if requireFS(dir, unix.BPF_FS_MAGIC, "bpffs") == nil {
		return nil
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpffs at %s: %w", dir, err)
	}
	return nil
}
