// Command coredns builds the local cluster's DNS server from
// github.com/coredns/coredns, pinned in this module's go.mod, so that pods
// of the cluster tests/cluster starts resolve Services by name
// (skipper.skipper-system.svc.cluster.local) without a pull from a public
// registry: `make coredns` builds bin/coredns, `make image` puts it in the
// image ghcr.io/skipper-dev/coredns:dev, and tests/cluster/dns runs it as
// the Deployment coredns behind the Service kube-dns at the kubelets'
// clusterDNS address.
//
// It is a minimal main, not CoreDNS's own: coremain.Run with only the
// plugins a cluster's DNS uses, registered as core/plugin/zplugin.go does
// (a blank import each) and ordered by dnsserver.Directives as
// core/dnsserver/zdirectives.go orders them. CoreDNS's main links every
// plugin in plugin.cfg, the cloud providers' DNS APIs (Route 53, Azure,
// Cloud DNS) and etcd among them; this one builds in a fraction of the time
// and is a fraction of the size. The plugins, and why each:
//
//   - kubernetes: the point: answers cluster.local from the API server's
//     Services and EndpointSlices (A, AAAA, SRV, PTR for in-addr.arpa and
//     ip6.arpa), pod names with `pods insecure`.
//   - forward: every other name to an upstream, as a cluster's Corefile
//     has it. Linked, but the local cluster's Corefile (tests/cluster/dns)
//     leaves it out: test traffic stays inside the cluster's namespaces,
//     so a name outside cluster.local fails.
//   - cache: answers reused for their TTL (at most 30s in the Corefile).
//   - loop: stops CoreDNS when forward would send its queries back to
//     itself (a node whose resolv.conf names the cluster DNS); goes with
//     forward.
//   - errors: failed queries on stderr; log: a line per query, when a
//     Corefile adds it to debug.
//   - health (:8080/health) and ready (:8181/ready): the Deployment's
//     liveness and readiness probes; ready waits for the kubernetes
//     plugin's first sync.
//   - reload: a changed ConfigMap is applied without a restart.
//   - loadbalance: A, AAAA and MX records of an answer in random order.
//
// A Corefile naming any other directive fails at start ("Unknown directive
// 'prometheus'"), and so does CoreDNS without -conf (its default Corefile
// uses whoami). `coredns -plugins` lists a few more (debug, dnstap,
// metadata, prometheus, transfer): packages the kept plugins import
// register themselves, but only Directives are accepted in a Corefile. Compare main.go with plugin.cfg when bumping the version: an
// added directive is not needed here, a renamed or reordered one is.
//
// It is a nested module so CoreDNS's dependency graph (client-go, miekg/dns,
// quic-go at CoreDNS's versions) stays out of the product's go.mod, as
// tests/containerd does for containerd. `make coredns` builds it with
// CGO_ENABLED=0, -trimpath and -ldflags "-s -w".
package main
