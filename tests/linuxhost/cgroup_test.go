package linuxhost

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/moby/sys/mountinfo"
)

// mount is one mount table entry: what HierarchiesOf reads of it.
func mount(fsType, point, superOpts string) *mountinfo.Info {
	return &mountinfo.Info{FSType: fsType, Mountpoint: point, VFSOptions: superOpts}
}

func TestHierarchiesOf(t *testing.T) {
	tests := []struct {
		name    string
		mounts  []*mountinfo.Info
		want    []Hierarchy
		wantErr error
	}{
		{
			name: "hybrid",
			mounts: []*mountinfo.Info{
				mount("tmpfs", "/sys/fs/cgroup", "rw"),
				mount("cgroup", "/sys/fs/cgroup/cpu", "rw,cpu"),
				mount("cgroup", "/sys/fs/cgroup/cpuacct", "rw,cpuacct"),
				mount("cgroup", "/sys/fs/cgroup/cpuset", "rw,cpuset"),
				mount("cgroup", "/sys/fs/cgroup/memory", "rw,memory"),
				mount("cgroup", "/sys/fs/cgroup/pids", "rw,pids"),
				mount("cgroup", "/sys/fs/cgroup/systemd", "rw,name=systemd"),
				mount("cgroup2", "/sys/fs/cgroup/unified", "rw"),
			},
			want: []Hierarchy{{Mount: "/sys/fs/cgroup/unified"},
				{Mount: "/sys/fs/cgroup/cpu", Controllers: []string{"cpu"}},
				{Mount: "/sys/fs/cgroup/cpuacct", Controllers: []string{"cpuacct"}},
				{Mount: "/sys/fs/cgroup/memory", Controllers: []string{"memory"}},
				{Mount: "/sys/fs/cgroup/pids", Controllers: []string{"pids"}}},
		},
		{
			name: "combined cpu,cpuacct mounted twice",
			mounts: []*mountinfo.Info{
				mount("cgroup", "/sys/fs/cgroup/cpu,cpuacct", "rw,cpu,cpuacct"),
				mount("cgroup", "/mnt/again", "rw,cpu,cpuacct"),
				mount("cgroup2", "/sys/fs/cgroup/unified", "rw"),
			},
			want: []Hierarchy{{Mount: "/sys/fs/cgroup/unified"},
				{Mount: "/sys/fs/cgroup/cpu,cpuacct", Controllers: []string{"cpu", "cpuacct"}}},
		},
		{name: "unified", mounts: []*mountinfo.Info{mount("cgroup2", "/sys/fs/cgroup", "rw,nsdelegate")}, want: []Hierarchy{{Mount: "/sys/fs/cgroup"}}},
		{name: "no cgroup2", mounts: []*mountinfo.Info{mount("cgroup", "/sys/fs/cgroup/cpu", "rw,cpu")}, wantErr: ErrNoCgroup2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := HierarchiesOf(tt.mounts)
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

// TestEnableControllers enables a controller the machine's cgroup2 root
// delegates down a fresh test subtree (never touching the root itself).
func TestEnableControllers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: cgroups")
	}
	mount, err := Cgroup2Mount()
	if err != nil {
		t.Skipf("no cgroup2: %v", err)
	}
	// What the root hands its children is what a subtree can enable.
	data, _ := os.ReadFile(filepath.Join(mount, "cgroup.subtree_control"))
	offered := strings.Fields(string(data))
	if len(offered) == 0 {
		t.Skip("the cgroup2 root delegates no controllers on this machine (hybrid: they are on v1)")
	}
	want := offered[:1]
	rel := fmt.Sprintf("/sktest-%d/a/b", os.Getpid())
	t.Cleanup(func() {
		if err := RemoveTree(filepath.Join(mount, fmt.Sprintf("sktest-%d", os.Getpid())), 5*time.Second); err != nil {
			t.Error(err)
		}
	})
	if err := MakeDirs([]string{filepath.Join(mount, rel)}); err != nil {
		t.Fatal(err)
	}
	for range 2 { // idempotent
		if err := EnableControllers(mount, rel, append([]string{"no-such-controller"}, want...)); err != nil {
			t.Fatal(err)
		}
	}
	got, _ := os.ReadFile(filepath.Join(mount, rel, "cgroup.controllers"))
	if diff := cmp.Diff(want, strings.Fields(string(got))); diff != "" {
		t.Errorf("controllers of %s (-want +got):\n%s", rel, diff)
	}
	root, _ := os.ReadFile(filepath.Join(mount, "cgroup.subtree_control"))
	t.Logf("root subtree_control (left alone): %q", root)
}

// TestEnableControllersWrites runs EnableControllers on a fake hierarchy of
// plain files: what each level offers of want is written to its
// subtree_control, down to the cgroup's parent, and nothing below a level
// that offers none of it.
func TestEnableControllersWrites(t *testing.T) {
	root := t.TempDir()
	files := map[string]string{
		"a/cgroup.controllers":       "cpuset cpu io memory pids",
		"a/b/cgroup.controllers":     "cpu memory",
		"a/b/c/cgroup.controllers":   "",
		"x/cgroup.controllers":       "io",
		"x/y/cgroup.controllers":     "cpu",
		"a/cgroup.subtree_control":   "",
		"a/b/cgroup.subtree_control": "",
		"x/cgroup.subtree_control":   "",
		"x/y/cgroup.subtree_control": "",
	}
	for name, data := range files {
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := EnableControllers(root, "/a/b/c/d", PodControllers); err != nil {
		t.Fatal(err)
	}
	if err := EnableControllers(root, "/x/y/z", PodControllers); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, name := range []string{"a", "a/b", "x", "x/y"} {
		data, _ := os.ReadFile(filepath.Join(root, name, "cgroup.subtree_control"))
		got[name] = string(data)
	}
	want := map[string]string{"a": "+cpu +memory +pids", "a/b": "+cpu +memory", "x": "", "x/y": ""}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("subtree_control (-want +got):\n%s", diff)
	}
	if err := EnableControllers(root, "/missing/c", PodControllers); err == nil {
		t.Error("a missing ancestor: want an error")
	}
}
