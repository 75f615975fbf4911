package cgroup

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/moby/sys/mountinfo"
)

// TestMountsOf reads mount tables in /proc/self/mountinfo's format: a v1
// hierarchy's controllers are among its superblock options (after the -).
func TestMountsOf(t *testing.T) {
	const (
		v2Root    = "26 21 0:23 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
		v2Unified = "40 30 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
	)
	tests := []struct {
		name   string
		mounts string
		v2     []string // cgroup.controllers of the cgroup2 root
		want   Mounts
	}{
		{"pure v2", v2Root, []string{"cpu", "memory", "pids"},
			Mounts{CPU: Hierarchy{"/sys/fs/cgroup", true}, Memory: Hierarchy{"/sys/fs/cgroup", true}}},
		{"hybrid: v2 without the controllers", "32 30 0:29 / /sys/fs/cgroup/cpuacct rw - cgroup cgroup rw,cpuacct\n" +
			"34 30 0:31 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n" + v2Unified, []string{"hugetlb"},
			Mounts{CPU: Hierarchy{"/sys/fs/cgroup/cpuacct", false}, Memory: Hierarchy{"/sys/fs/cgroup/memory", false}}},
		{"v2 memory, v1 cpu,cpuacct co-mounted", "31 30 0:28 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n" + v2Unified, []string{"memory"},
			Mounts{CPU: Hierarchy{"/sys/fs/cgroup/cpu,cpuacct", false}, Memory: Hierarchy{"/sys/fs/cgroup/unified", true}}},
		{"escaped mount point", `26 21 0:23 / /mnt/my\040cgroups rw - cgroup2 cgroup2 rw` + "\n", []string{"cpu"},
			Mounts{CPU: Hierarchy{"/mnt/my cgroups", true}}},
		{"cpu without cpuacct is not enough on v1", "31 30 0:28 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n", nil, Mounts{}},
		{"none", "22 26 0:21 / /proc rw - proc proc rw\n", nil, Mounts{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ms, err := mountinfo.GetMountsFromReader(strings.NewReader(tt.mounts), nil)
			if err != nil {
				t.Fatal(err)
			}
			got := MountsOf(ms, func(string) []string { return tt.v2 })
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestPodUID(t *testing.T) {
	tests := []struct {
		name, want string
		ok         bool
	}{
		{"pod6f1c2a3b-1111-2222-3333-444455556666", "6f1c2a3b-1111-2222-3333-444455556666", true},
		{"kubepods-burstable-pod6f1c2a3b_1111_2222_3333_444455556666.slice", "6f1c2a3b-1111-2222-3333-444455556666", true},
		{"kubepods-pod0a0b_1.slice", "0a0b-1", true},
		{"kubepods-besteffort.slice", "", false},
		{"kubepods.slice", "", false},
		{"kubepods-besteffort-pod.slice", "", false},
		{"pod", "", false},
		{"pod.slice", "", false},
		{"burstable", "", false},
		{"cri-containerd-abc.scope", "", false},
	}
	for _, tt := range tests {
		got, ok := PodUID(tt.name)
		if got != tt.want || ok != tt.ok {
			t.Errorf("PodUID(%q) = %q, %v; want %q, %v", tt.name, got, ok, tt.want, tt.ok)
		}
	}
}

func TestValues(t *testing.T) {
	if d, err := CPUUsage(true, []byte("usage_usec 1500\nuser_usec 1000\n")); err != nil || d != 1500*time.Microsecond {
		t.Errorf("v2 cpu = %v, %v", d, err)
	}
	if d, err := CPUUsage(false, []byte("123456789\n")); err != nil || d != 123456789 {
		t.Errorf("v1 cpu = %v, %v", d, err)
	}
	if _, err := CPUUsage(true, []byte("user_usec 1\n")); !errors.Is(err, errNoKey) {
		t.Errorf("v2 cpu without usage_usec: %v", err)
	}
	if n, err := WorkingSet(true, []byte("1000\n"), []byte("active_file 1\ninactive_file 300\n")); err != nil || n != 700 {
		t.Errorf("v2 working set = %d, %v", n, err)
	}
	if n, err := WorkingSet(false, []byte("1000"), []byte("inactive_file 1\ntotal_inactive_file 2000\n")); err != nil || n != 0 {
		t.Errorf("v1 working set below zero = %d, %v", n, err)
	}
	if _, err := WorkingSet(false, []byte("x"), nil); err == nil {
		t.Error("garbage usage parsed")
	}
	for _, tt := range []struct {
		prev, cur, dt time.Duration
		want          uint64
		ok            bool
	}{
		{time.Second, 1500 * time.Millisecond, time.Second, 500, true},
		{0, 4 * time.Second, 2 * time.Second, 2000, true},
		{time.Second, time.Second, time.Second, 0, true},
		{2 * time.Second, time.Second, time.Second, 0, false},
		{0, time.Second, 0, 0, false},
	} {
		if got, ok := Millicores(tt.prev, tt.cur, tt.dt); got != tt.want || ok != tt.ok {
			t.Errorf("Millicores(%v, %v, %v) = %d, %v; want %d, %v", tt.prev, tt.cur, tt.dt, got, ok, tt.want, tt.ok)
		}
	}
}

func TestReaderTrees(t *testing.T) {
	now := time.Unix(1000, 0)
	tests := []struct {
		name, tree, root, uid string
		want                  Usage
		wantErr               error
	}{
		{"v2 systemd burstable", "testdata/v2", "/", "6f1c2a3b-1111-2222-3333-444455556666",
			Usage{CPU: 2500 * time.Millisecond, HasCPU: true, Memory: 104857600 - 40000000, HasMemory: true}, nil},
		{"v2 systemd guaranteed, inactive over usage", "testdata/v2", "/", "0a0b0c0d-0000-0000-0000-000000000001",
			Usage{HasCPU: true, HasMemory: true}, nil},
		{"v1 cgroupfs below the cgroup root", "testdata/hybrid", "/skipper", "5b0e0e0e-aaaa-bbbb-cccc-000000000002",
			Usage{CPU: 7 * time.Second, HasCPU: true, Memory: 16777216, HasMemory: true}, nil},
		{"a pod outside the cgroup root", "testdata/hybrid", "/skipper", "ffffffff-0000-0000-0000-000000000009", Usage{}, ErrPodNotFound},
		{"unknown pod", "testdata/v2", "/", "nope", Usage{}, ErrPodNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := Open(tt.tree, tt.root)
			if err != nil {
				t.Fatal(err)
			}
			got, err := r.Read(tt.uid, now)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestReaderRescanBound(t *testing.T) {
	r, err := Open("testdata/v2", "/")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	if _, err := r.Read("nope", now); !errors.Is(err, ErrPodNotFound) {
		t.Fatal(err)
	}
	first := r.lastScan
	// A second unknown uid within MinRescan does not walk again.
	if _, err := r.Read("nope-2", now.Add(MinRescan/2)); !errors.Is(err, ErrPodNotFound) {
		t.Fatal(err)
	}
	if r.lastScan != first {
		t.Errorf("walked again within %s", MinRescan)
	}
	// A known uid is served from the cache whatever the time.
	if _, err := r.Read("6f1c2a3b-1111-2222-3333-444455556666", now.Add(MinRescan/2)); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Read("nope-3", now.Add(MinRescan)); !errors.Is(err, ErrPodNotFound) || r.lastScan == first {
		t.Errorf("no new walk after %s: %v", MinRescan, err)
	}
}

func TestOpenWithoutHierarchies(t *testing.T) {
	if _, err := Open(t.TempDir(), "/"); err == nil {
		t.Error("no mount table: want an error")
	}
}
