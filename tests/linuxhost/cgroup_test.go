package linuxhost

import (
	"bytes"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseHierarchies(t *testing.T) {
	tests := []struct {
		name, mounts string
		want         []Hierarchy
		wantErr      error
	}{
		{
			name: "hybrid",
			mounts: "tmpfs /sys/fs/cgroup tmpfs rw 0 0\n" +
				"cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\n" +
				"cgroup /sys/fs/cgroup/cpuacct cgroup rw,relatime,cpuacct 0 0\n" +
				"cgroup /sys/fs/cgroup/cpuset cgroup rw,relatime,cpuset 0 0\n" +
				"cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n" +
				"cgroup /sys/fs/cgroup/pids cgroup rw,relatime,pids 0 0\n" +
				"cgroup /sys/fs/cgroup/systemd cgroup rw,relatime,name=systemd 0 0\n" +
				"cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n",
			want: []Hierarchy{{Mount: "/sys/fs/cgroup/unified"},
				{Mount: "/sys/fs/cgroup/cpu", Controllers: []string{"cpu"}},
				{Mount: "/sys/fs/cgroup/cpuacct", Controllers: []string{"cpuacct"}},
				{Mount: "/sys/fs/cgroup/memory", Controllers: []string{"memory"}},
				{Mount: "/sys/fs/cgroup/pids", Controllers: []string{"pids"}}},
		},
		{
			name: "combined cpu,cpuacct mounted twice",
			mounts: "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,cpu,cpuacct 0 0\n" +
				"cgroup /mnt/again cgroup rw,cpu,cpuacct 0 0\n" +
				"cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n",
			want: []Hierarchy{{Mount: "/sys/fs/cgroup/unified"},
				{Mount: "/sys/fs/cgroup/cpu,cpuacct", Controllers: []string{"cpu", "cpuacct"}}},
		},
		{name: "unified", mounts: "cgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n", want: []Hierarchy{{Mount: "/sys/fs/cgroup"}}},
		{name: "escaped", mounts: "cgroup2 /mnt/my\\040cg cgroup2 rw 0 0\n", want: []Hierarchy{{Mount: "/mnt/my cg"}}},
		{name: "no cgroup2", mounts: "cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n", wantErr: ErrNoCgroup2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseHierarchies(bytes.NewBufferString(tt.mounts))
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestDirs(t *testing.T) {
	hs := []Hierarchy{{Mount: "/sys/fs/cgroup/unified"}, {Mount: "/sys/fs/cgroup/memory", Controllers: []string{"memory"}}}
	got := Dirs(hs, "/skipper/node1")
	want := []string{"/sys/fs/cgroup/unified/skipper/node1", "/sys/fs/cgroup/memory/skipper/node1"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}
