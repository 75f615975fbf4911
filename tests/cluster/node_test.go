package cluster

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"skipper.dev/skipper/tests/linuxhost"
)

func testNodeConfig(t *testing.T) (*Config, Cgroups) {
	t.Helper()
	c := &Config{RepoDir: "/repo", Nodes: 2}
	if err := c.defaults(); err != nil {
		t.Fatal(err)
	}
	cg := Cgroups{
		Name: "skipper",
		Hier: []linuxhost.Hierarchy{{Mount: "/sys/fs/cgroup/unified"}, {Mount: "/sys/fs/cgroup/pids", Controllers: []string{"pids"}}},
		All: []linuxhost.Hierarchy{{Mount: "/sys/fs/cgroup/unified"}, {Mount: "/sys/fs/cgroup/pids", Controllers: []string{"pids"}},
			{Mount: "/sys/fs/cgroup/devices", Controllers: []string{"devices"}}},
	}
	return c, cg
}

// TestNodeSpec: node 2's spec keeps everything of the node private (its
// runtime, kubelet, CNI state and pod namespaces mounted over the
// machine's paths, the kubelet's kernel tunables bound to files of its
// own), starts containerd before the kubelet, and kills what is left in
// the node's pod cgroups in every hierarchy.
func TestNodeSpec(t *testing.T) {
	c, cg := testNodeConfig(t)
	spec, files := c.nodeSpec(2, cg)
	dir := "/repo/.skipper/nodes/node2"
	targets := map[string]string{}
	for _, m := range spec.Mounts {
		targets[m.Target] = m.Source
	}
	for target, want := range map[string]string{
		"/var/lib/containerd":            dir + "/containerd",
		"/run/containerd":                dir + "/containerd-run",
		"/var/lib/kubelet":               dir + "/kubelet",
		"/var/lib/cni":                   dir + "/cni",
		"/var/log/pods":                  "/repo/.skipper/logs/pods/node2",
		"/run/netns":                     "", // a fresh tmpfs
		"/proc/sys/kernel/panic":         dir + "/sysctl/kernel.panic",
		"/proc/sys/vm/overcommit_memory": dir + "/sysctl/vm.overcommit_memory",
	} {
		got, ok := targets[target]
		if !ok || got != want {
			t.Errorf("mount on %s: source %q (mounted %v), want %q", target, got, ok, want)
		}
	}
	for k, v := range kernelTunables {
		if got := files[filepath.Join(dir, "sysctl", strings.ReplaceAll(k, "/", "."))]; got != v+"\n" {
			t.Errorf("tunable %s: file holds %q, want %q", k, got, v+"\n")
		}
	}
	var names []string
	for _, d := range spec.Daemons {
		names = append(names, d.Name)
	}
	if !slices.Equal(names, []string{"containerd", "kubelet"}) {
		t.Errorf("daemons %v, want containerd then kubelet", names)
	}
	if spec.Daemons[0].Socket != "/run/containerd/containerd.sock" {
		t.Errorf("containerd's readiness socket %q", spec.Daemons[0].Socket)
	}
	kubelet := strings.Join(spec.Daemons[1].Args, " ")
	for _, want := range []string{"--node-ip=198.51.100.12", "--hostname-override=node2", "--kubeconfig=/repo/.skipper/pki/node2.kubeconfig"} {
		if !strings.Contains(kubelet, want) {
			t.Errorf("kubelet args %q lack %q", kubelet, want)
		}
	}
	wantCg := []string{"/sys/fs/cgroup/unified/skipper/node2/kubepods", "/sys/fs/cgroup/pids/skipper/node2/kubepods", "/sys/fs/cgroup/devices/skipper/node2/kubepods"}
	if !slices.Equal(spec.PodCgroups, wantCg) {
		t.Errorf("pod cgroups %v, want %v", spec.PodCgroups, wantCg)
	}
	if spec.Sysctls["net/ipv4/ip_forward"] != "1" {
		t.Errorf("sysctls %v: want forwarding on", spec.Sysctls)
	}
	// The spec survives its JSON trip to the node process.
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	var back NodeSpec
	if err := json.Unmarshal(b, &back); err != nil || back.Name != "node2" || len(back.Mounts) != len(spec.Mounts) {
		t.Errorf("round trip: %v %+v", err, back)
	}
}

// TestKubeletConfig: what a node needs and the kubelet does not default to.
func TestKubeletConfig(t *testing.T) {
	c, cg := testNodeConfig(t)
	var got map[string]any
	if err := yaml.Unmarshal([]byte(c.kubeletConfig(1, cg)), &got); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]any{
		"kind":                        "KubeletConfiguration",
		"cgroupDriver":                "cgroupfs",
		"cgroupRoot":                  "/skipper/node1",
		"failCgroupV1":                false,
		"maxPods":                     float64(250),
		"address":                     "198.51.100.11",
		"readOnlyPort":                float64(0),
		"podCIDR":                     "198.18.1.0/24",
		"clusterDomain":               "cluster.local",
		"imageGCHighThresholdPercent": float64(100),
		"protectKernelDefaults":       false,
	} {
		if got[key] != want {
			t.Errorf("%s = %v (%T), want %v", key, got[key], got[key], want)
		}
	}
	if dns, _ := got["clusterDNS"].([]any); len(dns) != 1 || dns[0] != "198.19.0.10" {
		t.Errorf("clusterDNS = %v, want [198.19.0.10]", got["clusterDNS"])
	}
	if ev, _ := got["evictionHard"].(map[string]any); ev["memory.available"] != "1Mi" || ev["nodefs.available"] != "1Mi" {
		t.Errorf("evictionHard = %v: want the least thresholds", got["evictionHard"])
	}
}

// TestCNIConfig: node n's pods get addresses of its pod CIDR on cbr0.
func TestCNIConfig(t *testing.T) {
	c, _ := testNodeConfig(t)
	var conf struct {
		Plugins []struct {
			Type, Bridge string
			IsGateway    bool
			IPAM         struct {
				Ranges [][]struct{ Subnet string }
			}
		}
	}
	if err := json.Unmarshal([]byte(c.cniConfig(2)), &conf); err != nil {
		t.Fatal(err)
	}
	if len(conf.Plugins) != 2 || conf.Plugins[0].Type != "bridge" || conf.Plugins[1].Type != "portmap" {
		t.Fatalf("plugins %+v: want bridge then portmap", conf.Plugins)
	}
	br := conf.Plugins[0]
	if br.Bridge != "cbr0" || !br.IsGateway || len(br.IPAM.Ranges) != 1 || br.IPAM.Ranges[0][0].Subnet != "198.18.2.0/24" {
		t.Errorf("bridge plugin %+v: want cbr0, gateway, 198.18.2.0/24", br)
	}
}

// TestContainerdConfig: the sandbox image comes from the cluster's
// registry and is pinned; no path of the machine's is used.
func TestContainerdConfig(t *testing.T) {
	c, _ := testNodeConfig(t)
	conf := c.containerdConfig("/n")
	for _, want := range []string{
		`sandbox = "198.51.100.1:5000/skipper-dev/pause:dev"`,
		`config_path = "/n/etc/certs.d"`,
		`conf_dir = "/n/etc/cni"`,
		`bin_dirs = ["/usr/lib/cni"]`,
		`restrict_oom_score_adj = true`,
		`SystemdCgroup = false`,
		`BinaryName = "/usr/sbin/runc"`,
		`path = "/n/opt"`,
		`"io.containerd.nri.v1.nri"`,
	} {
		if !strings.Contains(conf, want) {
			t.Errorf("containerd config lacks %s:\n%s", want, conf)
		}
	}
	if hosts := registryHosts("198.51.100.1:5000"); !strings.Contains(hosts, `server = "http://198.51.100.1:5000"`) {
		t.Errorf("hosts.toml %q: want plain HTTP to the registry", hosts)
	}
}
