package callers

import (
	"net/netip"
	"slices"
	"sync"
)

// Identity is the pod a call comes from.
type Identity struct {
	Namespace      string
	ServiceAccount string
	// Pod is "<namespace>/<name>", for logs and the controller's refusals.
	Pod string
	// Account is "<namespace>/<serviceaccount>", made once (NewIdentity):
	// routers hand it to instances in X-Skipper-Caller.
	Account string
}

// NewIdentity is the identity of pod (a name) of ServiceAccount sa in
// namespace ns.
func NewIdentity(ns, sa, pod string) Identity {
	return Identity{Namespace: ns, ServiceAccount: sa, Pod: ns + "/" + pod, Account: ns + "/" + sa}
}

// Policy is a function's callers: a caller is allowed when its namespace
// is in Namespaces or "<namespace>/<serviceaccount>" in ServiceAccounts.
// A nil *Policy allows any caller; NewPolicy returns nil for empty lists.
type Policy struct {
	Namespaces      []string
	ServiceAccounts []string
}

// NewPolicy returns the policy of the lists, nil when both are empty.
func NewPolicy(namespaces, serviceAccounts []string) *Policy {
	if len(namespaces) == 0 && len(serviceAccounts) == 0 {
		return nil
	}
	return &Policy{Namespaces: slices.Clone(namespaces), ServiceAccounts: slices.Clone(serviceAccounts)}
}

// Allows reports whether id may call. The lists are short (at most 64
// each): a scan, with no allocation.
func (p *Policy) Allows(id Identity) bool {
	if p == nil {
		return true
	}
	if id.Namespace == "" {
		return false
	}
	if slices.Contains(p.Namespaces, id.Namespace) {
		return true
	}
	if id.ServiceAccount == "" {
		return false
	}
	n := len(id.Namespace)
	for _, sa := range p.ServiceAccounts {
		if len(sa) == n+1+len(id.ServiceAccount) && sa[:n] == id.Namespace && sa[n] == '/' && sa[n+1:] == id.ServiceAccount {
			return true
		}
	}
	return false
}

// Equal reports two policies that allow the same callers in the same
// order (as a controller sends them: sorted).
func (p *Policy) Equal(q *Policy) bool {
	if p == nil || q == nil {
		return p == q
	}
	return slices.Equal(p.Namespaces, q.Namespaces) && slices.Equal(p.ServiceAccounts, q.ServiceAccounts)
}

// Index maps the IPs of running pods to their identities. The zero value
// is ready to use.
type Index struct {
	mu    sync.RWMutex
	byIP  map[netip.Addr]entry
	byPod map[string][]netip.Addr // pod UID → the IPs it was indexed under
}

type entry struct {
	uid string
	id  Identity
}

// Lookup returns the identity of the pod that holds ip.
func (x *Index) Lookup(ip netip.Addr) (Identity, bool) {
	x.mu.RLock()
	e, ok := x.byIP[ip.Unmap()]
	x.mu.RUnlock()
	return e.id, ok
}

// Set indexes the pod uid under ips (replacing what it was indexed under
// before). An IP another pod holds moves to this one: a pod IP is reused
// only after its last holder stopped, and the informer's update for the
// new pod may come before the old one's delete.
func (x *Index) Set(uid string, id Identity, ips []netip.Addr) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.byIP == nil {
		x.byIP = make(map[netip.Addr]entry)
		x.byPod = make(map[string][]netip.Addr)
	}
	x.deleteLocked(uid)
	if len(ips) == 0 {
		return
	}
	own := make([]netip.Addr, 0, len(ips))
	for _, ip := range ips {
		ip = ip.Unmap()
		if prev, ok := x.byIP[ip]; ok && prev.uid != uid {
			x.byPod[prev.uid] = slices.DeleteFunc(x.byPod[prev.uid], func(a netip.Addr) bool { return a == ip })
		}
		x.byIP[ip] = entry{uid: uid, id: id}
		own = append(own, ip)
	}
	x.byPod[uid] = own
}

// Delete removes the pod uid. IPs that moved to another pod stay with it.
func (x *Index) Delete(uid string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.deleteLocked(uid)
}

func (x *Index) deleteLocked(uid string) {
	for _, ip := range x.byPod[uid] {
		if e, ok := x.byIP[ip]; ok && e.uid == uid {
			delete(x.byIP, ip)
		}
	}
	delete(x.byPod, uid)
}

// Len is the number of IPs indexed.
func (x *Index) Len() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return len(x.byIP)
}
