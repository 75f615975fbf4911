package cgroup

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"skipper.dev/skipper/internal/poll"
)

// childEnv makes the test binary a cgroup tenant: it waits for a line on
// stdin (sent once it is in the test cgroup), then touches 32 MiB and
// burns CPU until killed.
const childEnv = "SKIPPER_CGROUP_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		mem := make([]byte, 32<<20)
		for i := range mem {
			mem[i] = byte(i)
		}
		deadline := time.Now().Add(time.Minute) // never outlive a broken test
		for x := 0; time.Now().Before(deadline); x++ {
			mem[x%len(mem)]++
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestReaderRealCgroup makes a pod cgroup the way the kubelet's cgroupfs
// driver names it, under a fresh test directory of each hierarchy of this
// machine (never the root cgroup itself), moves a busy process into it and
// reads it back. Root only.
func TestReaderRealCgroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create cgroups")
	}
	probe, err := Open("", "/")
	if err != nil {
		t.Skipf("no usable cgroup hierarchy: %v", err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	root := "/skipper-cgroup-test-" + hex.EncodeToString(b[:])
	uid := "11111111-2222-3333-4444-" + hex.EncodeToString(b[:])
	rel := filepath.Join(root, "kubepods", "besteffort", "pod"+uid)

	var dirs []string // pod directories, one per distinct hierarchy
	mounts := []Hierarchy{probe.Mounts().CPU}
	if m := probe.Mounts().Memory; m != mounts[0] {
		mounts = append(mounts, m)
	}
	for _, h := range mounts {
		if h.Mount == "" {
			continue
		}
		top := filepath.Join(h.Mount, root)
		if err := os.Mkdir(top, 0o755); err != nil {
			t.Skipf("cannot create a test cgroup: %v", err)
		}
		t.Cleanup(func() { removeTree(t, top) })
		if h.V2 {
			// Enable the controllers down the test subtree (the machine's
			// root must have them in its subtree_control already).
			for _, d := range []string{top, filepath.Join(top, "kubepods"), filepath.Join(top, "kubepods", "besteffort")} {
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
				_ = os.WriteFile(filepath.Join(d, "cgroup.subtree_control"), []byte("+cpu +memory"), 0)
			}
		}
		dir := filepath.Join(h.Mount, rel)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, dir)
	}

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Registered after the directories' cleanups, so it runs first.
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	for _, d := range dirs {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
			t.Fatalf("move the child into %s: %v", d, err)
		}
	}
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		t.Fatal(err)
	}

	r, err := Open("", root)
	if err != nil {
		t.Fatal(err)
	}
	var first, u Usage
	start := time.Now()
	poll.Until(t, 20*time.Second, 50*time.Millisecond, "CPU and memory charged to the pod", func(context.Context) error {
		if u, err = r.Read(uid, time.Now()); err != nil {
			t.Fatalf("read the pod: %v", err)
		}
		if first == (Usage{}) {
			first = u
		}
		if !u.HasCPU || u.CPU-first.CPU < 200*time.Millisecond || u.HasMemory && u.Memory < 16<<20 {
			return fmt.Errorf("last sample %+v (first %+v)", u, first)
		}
		return nil
	})
	mc, ok := Millicores(first.CPU, u.CPU, time.Since(start))
	t.Logf("cpu %s (%d millicores since the first sample), memory working set %d bytes", u.CPU, mc, u.Memory)
	if !ok || mc == 0 || mc > 1000*uint64(runtime.NumCPU()) {
		t.Errorf("millicores = %d, %v for one busy process", mc, ok)
	}
}

// removeTree removes the test cgroup directories deepest first, retrying
// while the kernel still holds a just-killed process.
func removeTree(t *testing.T, top string) {
	t.Helper()
	var dirs []string
	_ = filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		poll.Until(t, 2*time.Second, 20*time.Millisecond, "remove test cgroup "+dirs[i], func(context.Context) error {
			if err := os.Remove(dirs[i]); err != nil && !os.IsNotExist(err) {
				return err
			}
			return nil
		})
	}
}
