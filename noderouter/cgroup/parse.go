package cgroup

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/moby/sys/mountinfo"
)

// Hierarchy is where one resource is read: a cgroup mount point.
type Hierarchy struct {
	Mount string
	V2    bool
}

// Mounts are the hierarchies of the two resources; a zero Hierarchy (no
// Mount) means the resource is not available.
type Mounts struct {
	CPU, Memory Hierarchy
}

// MountsOf picks the hierarchies from a mount table (mountinfo.GetMounts
// or GetMountsFromReader). v2Controllers returns the controllers listed in
// a cgroup2 mount's root cgroup.controllers.
func MountsOf(mounts []*mountinfo.Info, v2Controllers func(mount string) []string) Mounts {
	v2 := mountOf(mounts, "cgroup2", "")
	var ctrls []string
	if v2 != "" {
		ctrls = v2Controllers(v2)
	}
	pick := func(ctrl, v1opt string) Hierarchy {
		if v2 != "" && slices.Contains(ctrls, ctrl) {
			return Hierarchy{Mount: v2, V2: true}
		}
		if v1 := mountOf(mounts, "cgroup", v1opt); v1 != "" {
			return Hierarchy{Mount: v1}
		}
		return Hierarchy{}
	}
	return Mounts{CPU: pick("cpu", "cpuacct"), Memory: pick("memory", "memory")}
}

// mountOf returns the mount point of the first mount of fsType whose
// superblock options include opt (any, for ""), or "".
func mountOf(mounts []*mountinfo.Info, fsType, opt string) string {
	for _, m := range mounts {
		if m.FSType == fsType && (opt == "" || slices.Contains(strings.Split(m.VFSOptions, ","), opt)) {
			return m.Mountpoint
		}
	}
	return ""
}

// PodUID returns the pod UID a kubelet cgroup directory name carries:
// pod<uid> (cgroupfs driver) or kubepods[-<qos>]-pod<uid with _>.slice
// (systemd driver).
func PodUID(name string) (string, bool) {
	if uid, ok := strings.CutPrefix(name, "pod"); ok {
		if uid == "" || strings.Contains(uid, ".") {
			return "", false
		}
		return uid, true
	}
	rest, ok := strings.CutSuffix(name, ".slice")
	if !ok || !strings.HasPrefix(rest, "kubepods-") {
		return "", false
	}
	i := strings.LastIndex(rest, "-pod")
	if i < 0 || i+4 == len(rest) {
		return "", false
	}
	return strings.ReplaceAll(rest[i+4:], "_", "-"), true
}

// errNoKey is returned when a stat file lacks the key asked for.
var errNoKey = errors.New("key not found")

// statValue returns the value of key in a flat-keyed file ("key value"
// lines: cpu.stat, memory.stat).
func statValue(b []byte, key string) (uint64, error) {
	for line := range bytes.Lines(b) {
		k, v, ok := bytes.Cut(bytes.TrimSpace(line), []byte{' '})
		if ok && string(k) == key {
			n, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: %w", key, err)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("%s: %w", key, errNoKey)
}

// single parses a file holding one number (cpuacct.usage, memory.current).
func single(b []byte) (uint64, error) {
	return strconv.ParseUint(string(bytes.TrimSpace(b)), 10, 64)
}

// CPUUsage parses the cumulative CPU time of a cgroup: cpu.stat's
// usage_usec on cgroup2, cpuacct.usage (ns) on v1.
func CPUUsage(v2 bool, b []byte) (time.Duration, error) {
	if v2 {
		us, err := statValue(b, "usage_usec")
		return time.Duration(us) * time.Microsecond, err
	}
	ns, err := single(b)
	return time.Duration(ns), err
}

// WorkingSet is the kubelet's memory working set: usage minus the inactive
// file pages of stat, at least zero.
func WorkingSet(v2 bool, usage, stat []byte) (uint64, error) {
	u, err := single(usage)
	if err != nil {
		return 0, fmt.Errorf("memory usage: %w", err)
	}
	key := "total_inactive_file"
	if v2 {
		key = "inactive_file"
	}
	inactive, err := statValue(stat, key)
	if err != nil {
		return 0, fmt.Errorf("memory.stat: %w", err)
	}
	if inactive > u {
		return 0, nil
	}
	return u - inactive, nil
}

// Millicores is the CPU rate between two cumulative usage samples taken dt
// apart, in thousandths of a CPU. A usage that went backwards (a new
// cgroup under the same name) or no elapsed time gives false.
func Millicores(prev, cur, dt time.Duration) (uint64, bool) {
	if dt <= 0 || cur < prev {
		return 0, false
	}
	return uint64((cur - prev) * 1000 / dt), true
}
