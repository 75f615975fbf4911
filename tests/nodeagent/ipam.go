package nodeagent

import (
	"errors"
	"fmt"
	"net/netip"
)

// ErrPodCIDRFull is returned when every address of the pod CIDR is in use.
var ErrPodCIDRFull = errors.New("pod CIDR exhausted")

// IPAM hands out pod IPs from one IPv4 CIDR. It skips the network address,
// the first host (reserved as a gateway) and the broadcast address, and
// prefers the address after the last one given out so a deleted pod's IP is
// not reused at once. Not safe for concurrent use.
type IPAM struct {
	cidr  netip.Prefix
	used  map[netip.Addr]string // address → owner (pod UID)
	owner map[string]netip.Addr
	last  netip.Addr
}

// NewIPAM returns an allocator for cidr.
func NewIPAM(cidr netip.Prefix) (*IPAM, error) {
	if !cidr.Addr().Is4() || cidr.Bits() > 30 {
		return nil, fmt.Errorf("pod CIDR %s: want an IPv4 prefix of /30 or larger", cidr)
	}
	cidr = cidr.Masked()
	return &IPAM{cidr: cidr, used: map[netip.Addr]string{}, owner: map[string]netip.Addr{}, last: cidr.Addr().Next()}, nil
}

func (a *IPAM) usable(ip netip.Addr) bool {
	first := a.cidr.Addr().Next()
	return a.cidr.Contains(ip) && ip != a.cidr.Addr() && ip != first && ip != a.broadcast()
}

func (a *IPAM) broadcast() netip.Addr {
	b := a.cidr.Addr().As4()
	host := uint32(1)<<(32-a.cidr.Bits()) - 1
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]) | host
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// Allocate returns owner's address, giving it one if it has none.
func (a *IPAM) Allocate(owner string) (netip.Addr, error) {
	if ip, ok := a.owner[owner]; ok {
		return ip, nil
	}
	ip := a.last
	for range 1 << (32 - a.cidr.Bits()) {
		ip = ip.Next()
		if !a.cidr.Contains(ip) {
			ip = a.cidr.Addr()
			continue
		}
		if a.usable(ip) {
			if _, taken := a.used[ip]; !taken {
				a.take(owner, ip)
				return ip, nil
			}
		}
	}
	return netip.Addr{}, fmt.Errorf("%w: %s", ErrPodCIDRFull, a.cidr)
}

// Claim gives owner a specific address (a pod's IP from before an agent
// restart). It fails if the address is outside the CIDR or taken by another.
func (a *IPAM) Claim(owner string, ip netip.Addr) error {
	if cur, ok := a.owner[owner]; ok {
		if cur == ip {
			return nil
		}
		return fmt.Errorf("%s already holds %s", owner, cur)
	}
	if !a.usable(ip) {
		return fmt.Errorf("%s is not a usable address of %s", ip, a.cidr)
	}
	if other, taken := a.used[ip]; taken {
		return fmt.Errorf("%s is held by %s", ip, other)
	}
	a.take(owner, ip)
	return nil
}

func (a *IPAM) take(owner string, ip netip.Addr) {
	a.used[ip] = owner
	a.owner[owner] = ip
	a.last = ip
}

// Release frees owner's address, if any, and returns it.
func (a *IPAM) Release(owner string) (netip.Addr, bool) {
	ip, ok := a.owner[owner]
	if ok {
		delete(a.owner, owner)
		delete(a.used, ip)
	}
	return ip, ok
}

// Lookup returns owner's address.
func (a *IPAM) Lookup(owner string) (netip.Addr, bool) {
	ip, ok := a.owner[owner]
	return ip, ok
}
