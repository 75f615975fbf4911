package cgroup

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/moby/sys/mountinfo"
)

// Bounds of the walk that finds pod directories.
const (
	MaxDepth  = 6
	MaxDirs   = 20000
	MinRescan = time.Second
)

// ErrNoHierarchy is returned by Open when neither CPU nor memory can be
// read from any mounted cgroup hierarchy.
var ErrNoHierarchy = errors.New("no cgroup hierarchy with cpu/cpuacct or memory is mounted")

// ErrPodNotFound is returned by Read for a pod without a cgroup directory
// below the root (not on this node, gone, or not created yet).
var ErrPodNotFound = errors.New("no cgroup directory for the pod")

// Usage is one sample of a pod's cgroup. A resource whose hierarchy is
// missing or unreadable is left unset (Has* false).
type Usage struct {
	CPU       time.Duration // cumulative CPU time
	HasCPU    bool
	Memory    uint64 // working set, bytes
	HasMemory bool
}

// Reader samples pods' cgroups. It is safe for concurrent use.
type Reader struct {
	prefix string // prepended to every absolute path: "" on a node
	root   string // below each hierarchy's mount, e.g. "/" or "/skipper"
	mounts Mounts

	mu       sync.Mutex
	dirs     map[Hierarchy]map[string]string // pod uid → directory
	lastScan time.Time
}

// Open reads the mount table prefix/proc/self/mountinfo and returns a
// Reader of the pods below root in each hierarchy.
func Open(prefix, root string) (*Reader, error) {
	f, err := os.Open(filepath.Join(prefix, "/proc/self/mountinfo"))
	if err != nil {
		return nil, fmt.Errorf("cgroups: %w", err)
	}
	defer f.Close()
	ms, err := mountinfo.GetMountsFromReader(f, mountinfo.FSTypeFilter("cgroup", "cgroup2"))
	if err != nil {
		return nil, fmt.Errorf("cgroups: read mounts: %w", err)
	}
	m := MountsOf(ms, func(mount string) []string {
		b, err := os.ReadFile(filepath.Join(prefix, mount, "cgroup.controllers"))
		if err != nil {
			return nil
		}
		return strings.Fields(string(b))
	})
	if m.CPU.Mount == "" && m.Memory.Mount == "" {
		return nil, ErrNoHierarchy
	}
	return &Reader{prefix: prefix, root: path.Clean("/" + root), mounts: m, dirs: map[Hierarchy]map[string]string{}}, nil
}

// Mounts returns the hierarchies r reads.
func (r *Reader) Mounts() Mounts { return r.mounts }

// Read samples the pod with uid. It fails with ErrPodNotFound when neither
// hierarchy has a directory for it.
func (r *Reader) Read(uid string, now time.Time) (Usage, error) {
	var u Usage
	cpuFound, cpuErr := r.readIn(r.mounts.CPU, uid, now, func(dir string, v2 bool) (err error) {
		file := "cpuacct.usage"
		if v2 {
			file = "cpu.stat"
		}
		b, err := os.ReadFile(filepath.Join(dir, file))
		if err == nil {
			u.CPU, err = CPUUsage(v2, b)
		}
		u.HasCPU = err == nil
		return err
	})
	memFound, memErr := r.readIn(r.mounts.Memory, uid, now, func(dir string, v2 bool) error {
		usage := "memory.usage_in_bytes"
		if v2 {
			usage = "memory.current"
		}
		b, err := os.ReadFile(filepath.Join(dir, usage))
		var stat []byte
		if err == nil {
			stat, err = os.ReadFile(filepath.Join(dir, "memory.stat"))
		}
		if err == nil {
			u.Memory, err = WorkingSet(v2, b, stat)
		}
		u.HasMemory = err == nil
		return err
	})
	if !cpuFound && !memFound {
		return u, fmt.Errorf("pod %s: %w", uid, ErrPodNotFound)
	}
	return u, errors.Join(cpuErr, memErr)
}

// readIn runs read on the pod's directory in h, if h is mounted and has
// one. A directory that vanished is forgotten.
func (r *Reader) readIn(h Hierarchy, uid string, now time.Time, read func(dir string, v2 bool) error) (found bool, err error) {
	if h.Mount == "" {
		return false, nil
	}
	dir, ok := r.dir(h, uid, now)
	if !ok {
		return false, nil
	}
	if err := read(dir, h.V2); err != nil {
		r.forget(h, uid, err)
		return true, fmt.Errorf("pod %s in %s: %w", uid, h.Mount, err)
	}
	return true, nil
}

// forget drops a cached directory that can no longer be read (the pod's
// cgroup was removed).
func (r *Reader) forget(h Hierarchy, uid string, err error) {
	if !errors.Is(err, fs.ErrNotExist) {
		return
	}
	r.mu.Lock()
	delete(r.dirs[h], uid)
	r.mu.Unlock()
}

// dir returns the pod's directory in h, walking the hierarchies again when
// it is unknown and the last walk is at least MinRescan old.
func (r *Reader) dir(h Hierarchy, uid string, now time.Time) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if d, ok := r.dirs[h][uid]; ok {
		return d, true
	}
	if !r.lastScan.IsZero() && now.Sub(r.lastScan) < MinRescan {
		return "", false
	}
	r.lastScan = now
	for _, hh := range []Hierarchy{r.mounts.CPU, r.mounts.Memory} {
		if hh.Mount != "" {
			r.dirs[hh] = scan(filepath.Join(r.prefix, hh.Mount, r.root))
		}
	}
	d, ok := r.dirs[h][uid]
	return d, ok
}

// scan walks below top breadth first, at most MaxDepth levels and MaxDirs
// directories, and returns the pod directories it finds by uid. It does
// not descend into pod directories (their children are containers).
func scan(top string) map[string]string {
	out := map[string]string{}
	level := []string{top}
	seen := 0
	for depth := 0; depth < MaxDepth && len(level) > 0; depth++ {
		var next []string
		for _, dir := range level {
			ents, err := os.ReadDir(dir)
			if err != nil {
				continue
			}
			for _, e := range ents {
				if !e.IsDir() {
					continue
				}
				if seen++; seen > MaxDirs {
					return out
				}
				p := filepath.Join(dir, e.Name())
				if uid, ok := PodUID(e.Name()); ok {
					out[uid] = p
					continue
				}
				next = append(next, p)
			}
		}
		level = next
	}
	return out
}
