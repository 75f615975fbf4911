package nodeagent

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"skipper.dev/skipper/tests/linuxhost"
)

func TestPodCgroupPath(t *testing.T) {
	tests := []struct {
		qos  corev1.PodQOSClass
		want string
	}{
		{corev1.PodQOSGuaranteed, "kubepods/pod1f2e-3d"},
		{corev1.PodQOSBurstable, "kubepods/burstable/pod1f2e-3d"},
		{corev1.PodQOSBestEffort, "kubepods/besteffort/pod1f2e-3d"},
		{"", "kubepods/besteffort/pod1f2e-3d"},
	}
	for _, tt := range tests {
		t.Run(string(tt.qos), func(t *testing.T) {
			if got := PodCgroupPath(tt.qos, "1f2e-3d"); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

// testNode makes a network namespace standing in for a node's and removes
// it (and the pods' namespaces with prefix) at cleanup.
func testNode(t *testing.T, prefix string) string {
	t.Helper()
	name := prefix + "node"
	t.Cleanup(func() {
		names, _ := linuxhost.NetnsNames(prefix)
		for _, n := range names {
			if err := linuxhost.DeleteNetns(n); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
	})
	ns, err := linuxhost.EnsureNetns(name)
	if err != nil {
		t.Fatal(err)
	}
	ns.Close()
	return name
}

// TestPodNetwork wires two pods to a node's bridge inside a scratch node
// namespace: each has its own namespace and address, they reach each other
// and the gateway, and Del and Flush leave nothing behind.
func TestPodNetwork(t *testing.T) {
	requireRoot(t)
	prefix := fmt.Sprintf("sktest-%d-", os.Getpid())
	node := testNode(t, prefix)
	pn := podNet{CIDR: netip.MustParsePrefix("198.18.77.0/24"), Prefix: prefix + "pod-"}
	uids := []types.UID{"aaaa-1", "bbbb-2"}
	ips := []netip.Addr{netip.MustParseAddr("198.18.77.2"), netip.MustParseAddr("198.18.77.3")}
	err := linuxhost.InNetns(node, func() error {
		for range 2 { // re-runs are safe
			if err := pn.SetupNode(); err != nil {
				return err
			}
			for i, uid := range uids {
				if _, err := pn.Add(uid, ips[i]); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, uid := range uids {
		if _, err := os.Stat(linuxhost.NetnsPath(pn.Netns(uid))); err != nil {
			t.Errorf("pod %s netns: %v", uid, err)
		}
		// Pod i listens on its IP; the other pod and the node dial it.
		var ln net.Listener
		if err := linuxhost.InNetns(pn.Netns(uid), func() (err error) {
			ln, err = net.Listen("tcp4", ips[i].String()+":0")
			return err
		}); err != nil {
			t.Fatalf("listen in pod %s: %v", uid, err)
		}
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				fmt.Fprint(c, c.RemoteAddr().(*net.TCPAddr).IP)
				c.Close()
			}
		}()
		for from, want := range map[string]string{pn.Netns(uids[1-i]): ips[1-i].String(), node: pn.gateway().Addr().String()} {
			var got []byte
			err := linuxhost.InNetns(from, func() error {
				c, err := net.DialTimeout("tcp4", ln.Addr().String(), 2*time.Second)
				if err != nil {
					return err
				}
				defer c.Close()
				got, err = io.ReadAll(c)
				return err
			})
			if err != nil || string(got) != want {
				t.Errorf("dial pod %s from %s: seen as %q (%v), want %s", uid, from, got, err, want)
			}
		}
	}
	// The node namespace does not hold the pods' addresses itself.
	err = linuxhost.InNetns(node, func() error {
		addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if ip, _ := netip.AddrFromSlice(a.IP); ip == ips[0] || ip == ips[1] {
				t.Errorf("pod address %s on a node link", ip)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	err = linuxhost.InNetns(node, func() error {
		if err := pn.Del(uids[0]); err != nil {
			return err
		}
		if err := pn.Del(uids[0]); err != nil { // again: nothing left is fine
			return err
		}
		if _, err := netlink.LinkByName(VethName(uids[0])); err == nil {
			t.Errorf("veth of deleted pod %s left", uids[0])
		}
		return pn.Flush(slog.New(slog.NewTextHandler(io.Discard, nil)))
	})
	if err != nil {
		t.Fatal(err)
	}
	if names, _ := linuxhost.NetnsNames(pn.Prefix); len(names) > 0 {
		t.Errorf("pod namespaces left: %v", names)
	}
	err = linuxhost.InNetns(node, func() error {
		if _, err := netlink.LinkByName(VethName(uids[1])); err == nil {
			t.Errorf("veth of flushed pod %s left", uids[1])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestStartContainerNetnsAndCgroups starts a container in a pod namespace
// and pod cgroups made in every hierarchy, and checks where it ran.
func TestStartContainerNetnsAndCgroups(t *testing.T) {
	requireRoot(t)
	hs, err := linuxhost.Hierarchies()
	if err != nil {
		t.Skipf("cgroups: %v", err)
	}
	prefix := fmt.Sprintf("sktest-%d-", os.Getpid())
	node := testNode(t, prefix)
	pn := podNet{CIDR: netip.MustParsePrefix("198.18.78.0/24"), Prefix: prefix + "pod-"}
	uid := types.UID("cccc-3")
	var netnsName string
	if err := linuxhost.InNetns(node, func() (err error) {
		if err := pn.SetupNode(); err != nil {
			return err
		}
		netnsName, err = pn.Add(uid, netip.MustParseAddr("198.18.78.2"))
		return err
	}); err != nil {
		t.Fatal(err)
	}

	nodeRel := fmt.Sprintf("/sktest-%d/node1", os.Getpid())
	t.Cleanup(func() {
		for _, d := range linuxhost.Dirs(hs, path.Dir(nodeRel)) {
			if err := linuxhost.RemoveTree(d, 5*time.Second); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
	})
	cg, err := newPodCgroups(filepath.Join(hs[0].Mount, nodeRel), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: uid}, Status: corev1.PodStatus{QOSClass: corev1.PodQOSBurstable}}
	dirs, err := cg.EnsureContainer(pod, "app")
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(t.TempDir(), "c.log")
	p, err := startContainer(testInit(t), startSpec{
		Exec:    execSpec{Path: "/bin/sh", Argv: []string{"sh", "-c", "cat /proc/self/cgroup; ip -4 -o addr show dev eth0"}},
		LogPath: logPath, InitTimeout: 10 * time.Second, Netns: netnsName, Cgroups: dirs,
	})
	if err != nil {
		t.Fatal(err)
	}
	waitExit(t, p)
	out, _ := os.ReadFile(logPath)
	if !strings.Contains(string(out), "198.18.78.2/24") {
		t.Errorf("container is not in its pod namespace (no 198.18.78.2 on eth0):\n%s", out)
	}
	want := path.Join(nodeRel, "kubepods/burstable/pod"+string(uid), "app")
	var got []string
	for line := range strings.Lines(string(out)) {
		// hierarchy-id:controllers:path
		if f := strings.SplitN(strings.TrimSpace(line), ":", 3); len(f) == 3 && f[2] == want {
			got = append(got, f[1])
		}
	}
	var wantCtrls []string
	for _, h := range hs {
		wantCtrls = append(wantCtrls, strings.Join(h.Controllers, ","))
	}
	slices.Sort(wantCtrls)
	slices.Sort(got)
	if diff := cmp.Diff(wantCtrls, got); diff != "" {
		t.Errorf("hierarchies (controllers) holding the container in %s (-want +got):\n%s\n%s", want, diff, out)
	}
	if err := cg.RemovePod(pod, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if _, err := os.Stat(path.Dir(d)); err == nil {
			t.Errorf("pod cgroup %s left", path.Dir(d))
		}
	}
}
