package cgroup

import (
	"strings"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
)

// FuzzPodUID: directory names of either driver never panic, a UID found is
// never empty, and both namings of the same UID agree.
func FuzzPodUID(f *testing.F) {
	for _, s := range []string{"pod6f1c2a3b-1111-2222-3333-444455556666", "kubepods-burstable-pod6f1c_2a3b.slice",
		"kubepods-pod.slice", "pod", "kubepods.slice", "-pod.slice", "kubepods--pod-.slice"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		uid, ok := PodUID(name)
		if ok && uid == "" {
			t.Fatalf("PodUID(%q) found an empty UID", name)
		}
		if !ok || strings.ContainsAny(uid, "._/") {
			return
		}
		if got, ok := PodUID("pod" + uid); !ok || got != uid {
			t.Errorf("cgroupfs name of %q gave %q, %v", uid, got, ok)
		}
		if got, ok := PodUID("kubepods-besteffort-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice"); !ok || got != uid {
			t.Errorf("systemd name of %q gave %q, %v", uid, got, ok)
		}
	})
}

// FuzzParse: mounts, stat files and numbers never panic.
func FuzzParse(f *testing.F) {
	f.Add("26 21 0:23 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n31 30 0:28 / /a\\040b rw - cgroup cgroup rw,cpuacct,memory\n", "usage_usec 12\ninactive_file 3\n", "100\n")
	f.Fuzz(func(t *testing.T, mounts, stat, num string) {
		if ms, err := mountinfo.GetMountsFromReader(strings.NewReader(mounts), nil); err == nil {
			_ = MountsOf(ms, func(string) []string { return strings.Fields(stat) })
		}
		_, _ = CPUUsage(true, []byte(stat))
		_, _ = CPUUsage(false, []byte(num))
		if ws, err := WorkingSet(true, []byte(num), []byte(stat)); err == nil {
			if u, _ := single([]byte(num)); ws > u {
				t.Fatalf("working set %d above usage %d", ws, u)
			}
		}
		_, _ = Millicores(time.Duration(len(num)), time.Duration(len(stat)), time.Duration(len(mounts)))
	})
}
