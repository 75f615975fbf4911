package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Control-plane endpoints in the root namespace.
const (
	etcdClientURL = "http://127.0.0.1:2379"
	etcdPeerURL   = "http://127.0.0.1:2380"
	apiserverPort = 6443
	kcmPort       = 10257
	schedulerPort = 10259
	// kube-proxy's ports on each node's IP.
	kubeProxyMetricsPort = 10249
	kubeProxyHealthzPort = 10256
	// saIssuer is both the service-account issuer and the API audience.
	saIssuer = "https://kubernetes.default.svc.cluster.local"
)

func (c *Config) apiserverURL() string {
	return fmt.Sprintf("https://%s:%d", c.Topology.Gateway.Addr(), apiserverPort)
}

func (c *Config) kube(component string) string { return filepath.Join(c.BinDir, component) }

func (c *Config) etcdSpec() ProcSpec {
	return ProcSpec{Name: "etcd", Path: c.kube("etcd"), Args: []string{
		"--name=skipper",
		"--data-dir=" + c.State.EtcdDir(),
		"--listen-client-urls=" + etcdClientURL,
		"--advertise-client-urls=" + etcdClientURL,
		"--listen-peer-urls=" + etcdPeerURL,
		"--initial-advertise-peer-urls=" + etcdPeerURL,
		"--initial-cluster=skipper=" + etcdPeerURL,
		"--initial-cluster-state=new",
		// A throwaway dev cluster: losing the last writes on a host crash is
		// fine, waiting for fsync on every write is not.
		"--unsafe-no-fsync",
		"--log-level=warn",
	}}
}

func (c *Config) apiserverSpec() ProcSpec {
	p := PKI{Dir: c.State.PKI()}
	return ProcSpec{Name: "kube-apiserver", Path: c.kube("kube-apiserver"), Args: []string{
		"--etcd-servers=" + etcdClientURL,
		"--bind-address=" + c.Topology.Gateway.Addr().String(),
		"--advertise-address=" + c.Topology.Gateway.Addr().String(),
		"--secure-port=" + strconv.Itoa(apiserverPort),
		"--tls-cert-file=" + p.Path("apiserver.crt"),
		"--tls-private-key-file=" + p.Path("apiserver.key"),
		"--client-ca-file=" + p.Path("ca.crt"),
		"--kubelet-client-certificate=" + p.Path("apiserver-kubelet-client.crt"),
		"--kubelet-client-key=" + p.Path("apiserver-kubelet-client.key"),
		"--kubelet-preferred-address-types=InternalIP",
		"--service-cluster-ip-range=" + c.Topology.ServiceCIDR.String(),
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--service-account-issuer=" + saIssuer,
		"--service-account-key-file=" + p.Path("sa.pub"),
		"--service-account-signing-key-file=" + p.Path("sa.key"),
		"--api-audiences=" + saIssuer,
		"--allow-privileged=true",
		"--enable-bootstrap-token-auth=false",
		"--profiling=false",
		"--event-ttl=1h",
	}}
}

func (c *Config) kcmSpec() ProcSpec {
	p := PKI{Dir: c.State.PKI()}
	kc := p.Kubeconfig("kube-controller-manager")
	return ProcSpec{Name: "kube-controller-manager", Path: c.kube("kube-controller-manager"), Args: slices.Concat(componentArgs(kc, kcmPort), []string{
		"--use-service-account-credentials=true",
		"--service-account-private-key-file=" + p.Path("sa.key"),
		"--root-ca-file=" + p.Path("ca.crt"),
		"--cluster-signing-cert-file=" + p.Path("ca.crt"),
		"--cluster-signing-key-file=" + p.Path("ca.key"),
		"--cluster-cidr=" + c.Topology.PodSupernet.String(),
		"--allocate-node-cidrs=false", // each node's CNI config (host-local) holds its pod CIDR; no Node has spec.podCIDR
		"--service-cluster-ip-range=" + c.Topology.ServiceCIDR.String(),
		"--profiling=false",
	})}
}

func (c *Config) schedulerSpec() ProcSpec {
	kc := PKI{Dir: c.State.PKI()}.Kubeconfig("kube-scheduler")
	return ProcSpec{Name: "kube-scheduler", Path: c.kube("kube-scheduler"), Args: append(componentArgs(kc, schedulerPort), "--profiling=false")}
}

// componentArgs are kube-controller-manager's and kube-scheduler's flags:
// kc for the API server and for checking the callers of their secure port,
// served on loopback at port, no leader election (the cluster runs one of
// each).
func componentArgs(kc string, port int) []string {
	return []string{
		"--kubeconfig=" + kc,
		"--authentication-kubeconfig=" + kc,
		"--authorization-kubeconfig=" + kc,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--leader-elect=false",
	}
}

// kubeProxySpec runs node n's kube-proxy in the node's namespace, so its
// rules serve the node's pods and host-network processes and go with the
// namespace. Nothing it sets reaches the root namespace: conntrack limits
// and timeouts are left alone and localhost NodePorts (route_localnet) are
// off.
func (c *Config) kubeProxySpec(n int, cg Cgroups) ProcSpec {
	ip := c.Topology.NodeIP(n).String()
	spec := ProcSpec{Name: "kube-proxy-" + NodeName(n), Path: c.kube("kube-proxy"), Netns: c.Topology.Netns(n), Args: []string{
		"--kubeconfig=" + PKI{Dir: c.State.PKI()}.Kubeconfig("kube-proxy"),
		"--hostname-override=" + NodeName(n),
		"--bind-address=" + ip,
		"--proxy-mode=" + c.ProxyMode,
		"--cluster-cidr=" + c.Topology.PodSupernet.String(),
		"--metrics-bind-address=" + ip + ":" + strconv.Itoa(kubeProxyMetricsPort),
		"--healthz-bind-address=" + ip + ":" + strconv.Itoa(kubeProxyHealthzPort),
		"--conntrack-max-per-core=0",
		"--conntrack-tcp-timeout-established=0s",
		"--conntrack-tcp-timeout-close-wait=0s",
		"--conntrack-udp-timeout=0s",
		"--conntrack-udp-timeout-stream=0s",
		"--iptables-localhost-nodeports=false",
		"--oom-score-adj=0",
		"--profiling=false",
	}}
	// iptables, iptables-restore and nft live in the sbin directories.
	for _, kv := range childEnv() {
		if p, ok := strings.CutPrefix(kv, "PATH="); ok {
			kv = "PATH=" + p + ":/usr/sbin:/sbin"
		}
		spec.Env = append(spec.Env, kv)
	}
	return cg.Place(spec, cg.SystemRel(n))
}

// waitHTTP polls url until it answers 200, proc exits, ctx ends or timeout.
func waitHTTP(ctx context.Context, client *http.Client, url string, proc *Proc, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last string
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		select {
		case <-proc.Done():
			return fmt.Errorf("%s exited (%v) before %s answered; last lines of %s:\n%s",
				proc.Name, proc.Err(), url, proc.LogPath, tailFile(proc.LogPath, 25))
		case <-ctx.Done():
			if ctx.Err() == context.DeadlineExceeded {
				return fmt.Errorf("%s: %s not ready after %s (last: %s); last lines of %s:\n%s",
					proc.Name, url, timeout, last, proc.LogPath, tailFile(proc.LogPath, 25))
			}
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// adminHTTPClient talks TLS to the API server as the admin identity.
func adminHTTPClient(p PKI) (*http.Client, error) {
	ca, err := os.ReadFile(p.Path("ca.crt"))
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	cert, err := tls.LoadX509KeyPair(p.Path("admin.crt"), p.Path("admin.key"))
	if err != nil {
		return nil, err
	}
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}},
	}}, nil
}

// loopbackHealthClient checks the secure health ports of the controller
// manager and scheduler, whose serving certificates are self-signed.
func loopbackHealthClient() *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // loopback health check of a self-signed dev server
	}}
}
