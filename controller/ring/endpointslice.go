package ring

import (
	"net"
	"slices"
	"strconv"

	discoveryv1 "k8s.io/api/discovery/v1"
)

// PortName is the controller Service port whose number joins each endpoint
// address into a member ("ip:port").
const PortName = "grpc"

// MembersFromEndpointSlices returns the ring members of the controller
// Service's EndpointSlices: for every endpoint that is ready (an unset Ready
// reads as ready, the API's documented default) and not terminating, its
// first address (the API lets consumers use only the first) joined with the
// port named portName, or the slice's first port when none has that name.
// The result is sorted and without duplicates.
//
// Controllers and routers both build their rings with this function, so
// the same slices always give the same ring on either side. It only reads
// the objects it is given.
func MembersFromEndpointSlices(eps []*discoveryv1.EndpointSlice, portName string) []string {
	var out []string
	for _, s := range eps {
		port, ok := slicePort(s, portName)
		if !ok {
			continue
		}
		for _, ep := range s.Endpoints {
			if len(ep.Addresses) == 0 || !endpointMember(ep.Conditions) {
				continue
			}
			out = append(out, net.JoinHostPort(ep.Addresses[0], strconv.Itoa(int(port))))
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func slicePort(s *discoveryv1.EndpointSlice, name string) (int32, bool) {
	var first *discoveryv1.EndpointPort
	for i := range s.Ports {
		p := &s.Ports[i]
		if p.Port == nil {
			continue
		}
		if p.Name != nil && *p.Name == name {
			return *p.Port, true
		}
		if first == nil {
			first = p
		}
	}
	if first == nil {
		return 0, false
	}
	return *first.Port, true
}

// endpointMember: ready (nil means ready) and not terminating.
func endpointMember(c discoveryv1.EndpointConditions) bool {
	if c.Terminating != nil && *c.Terminating {
		return false
	}
	return c.Ready == nil || *c.Ready
}
