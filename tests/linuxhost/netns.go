package linuxhost

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NetnsDir is where named network namespaces are bind-mounted, as iproute2's
// `ip netns add` does, so `ip netns exec` works on ours.
const NetnsDir = "/run/netns"

// NetnsPath is the bind mount of the named namespace; an absolute path
// (a /proc/<pid>/ns/net, say) is a namespace by path and returned as is.
func NetnsPath(name string) string {
	if filepath.IsAbs(name) {
		return name
	}
	return filepath.Join(NetnsDir, name)
}

// EnsureNetns returns a handle to the named namespace, creating it (or
// replacing a stale file left by a crash mid-creation) as `ip netns add` does.
// The calling goroutine's thread is never left in the new namespace.
func EnsureNetns(name string) (netns.NsHandle, error) {
	path := NetnsPath(name)
	if isNsfs(path) {
		h, err := netns.GetFromPath(path)
		if err != nil {
			return netns.None(), fmt.Errorf("open netns %s: %w", name, err)
		}
		return h, nil
	}
	_ = unix.Unmount(path, unix.MNT_DETACH)
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return netns.None(), fmt.Errorf("remove stale %s: %w", path, err)
	}

	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return netns.None(), fmt.Errorf("current netns: %w", err)
	}
	defer orig.Close()
	h, err := netns.NewNamed(name)
	// NewNamed moved this thread into the new namespace (or may have, on
	// error): move it back, and if that fails keep it locked so the runtime
	// retires the thread instead of reusing it in the wrong namespace.
	if serr := netns.Set(orig); serr != nil {
		if err == nil {
			h.Close()
		}
		return netns.None(), fmt.Errorf("return to the original netns after creating %s: %w", name, serr)
	}
	runtime.UnlockOSThread()
	if err != nil {
		_ = os.Remove(path)
		return netns.None(), fmt.Errorf("create netns %s: %w", name, err)
	}
	return h, nil
}

// DeleteNetns unmounts and removes the named namespace's file; the
// namespace itself goes once nothing else holds it. Missing is fine.
func DeleteNetns(name string) error {
	path := NetnsPath(name)
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return nil
}

func isNsfs(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC
}

// NetnsNames lists the named namespaces whose name starts with prefix.
func NetnsNames(prefix string) ([]string, error) {
	entries, err := os.ReadDir(NetnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", NetnsDir, err)
	}
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

// InNetns runs fn on a thread switched into the named namespace (or the
// one at an absolute path, see NetnsPath); whatever fn
// starts (processes it forks) inherits that namespace. The thread returns to
// its original namespace afterwards, or is retired if it cannot.
func InNetns(name string, fn func() error) error {
	target, err := netns.GetFromPath(NetnsPath(name))
	if err != nil {
		return fmt.Errorf("open netns %s: %w", name, err)
	}
	defer target.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("current netns: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter netns %s: %w", name, err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			// Leave the thread locked: the goroutine ends and the runtime
			// kills the thread rather than schedule others in this namespace.
			errc <- errors.Join(ferr, fmt.Errorf("leave netns %s: %w", name, err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// NetnsPids lists the processes whose network namespace is the one
// bind-mounted at path.
func NetnsPids(path string) ([]int, error) {
	var want unix.Stat_t
	if err := unix.Stat(path, &want); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, nil
		}
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list /proc: %w", err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st) != nil {
			continue
		}
		if st.Ino == want.Ino && st.Dev == want.Dev {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// Sysctl writes value to /proc/sys/<key> (key with slashes). Network keys
// apply to the network namespace of the calling thread.
func Sysctl(key, value string) error {
	if err := os.WriteFile(filepath.Join("/proc/sys", key), []byte(value), 0o644); err != nil {
		return fmt.Errorf("sysctl %s=%s: %w", key, value, err)
	}
	return nil
}

// PrefixNet converts a netip prefix to the net.IPNet netlink takes.
func PrefixNet(p netip.Prefix) *net.IPNet {
	bits := 32
	if p.Addr().Is6() {
		bits = 128
	}
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), bits)}
}

// NetipPrefix converts a net.IPNet to a masked netip prefix.
func NetipPrefix(n *net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones).Masked(), true
}

// IsLinkNotFound reports a missing link.
func IsLinkNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENODEV)
}

// Dump runs a netlink dump again when the kernel interrupted it because the
// table changed underneath (netlink.ErrDumpInterrupted comes with partial
// results), as it does while namespaces and their links are being deleted.
func Dump[T any](list func() ([]T, error)) ([]T, error) {
	for try := 1; ; try++ {
		v, err := list()
		if !errors.Is(err, netlink.ErrDumpInterrupted) || try == 5 {
			return v, err
		}
	}
}
