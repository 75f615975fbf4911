package noderouter

import (
	"net/http"
	"net/netip"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"skipper.dev/skipper/noderouter/callers"
	"skipper.dev/skipper/noderouter/route"
	pb "skipper.dev/skipper/proto/skipperv1"
)

// Reasons of the 403s of spec.callers (the controller's PermissionDenied
// carries the same in an ErrorInfo of domain skipper.dev).
const (
	reasonCallerUnknown = "caller_unknown"
	reasonCallerDenied  = "caller_denied"
	callerErrorDomain   = "skipper.dev"
)

// caller is who a request came from, as far as the router can tell: the
// pod holding the connection's source address (a DaemonSet router's caller
// index), or a sidecar router's own pod.
type caller struct {
	id    callers.Identity
	known bool
	addr  netip.Addr // the source address, for the answers
}

// proto is c as GetInstance sends it.
func (c caller) proto() *pb.Caller {
	if !c.known {
		return &pb.Caller{Unknown: true}
	}
	return &pb.Caller{Namespace: c.id.Namespace, ServiceAccount: c.id.ServiceAccount, Pod: c.id.Pod}
}

// key tells identities apart for calls shared by callers of one function.
func (c caller) key() string {
	if !c.known {
		return ""
	}
	return c.id.Namespace + "/" + c.id.ServiceAccount
}

// identifier finds who holds a source address.
type identifier func(netip.Addr) (callers.Identity, bool)

// unknownCaller is the identifier of a router without a caller index.
func unknownCaller(netip.Addr) (callers.Identity, bool) { return callers.Identity{}, false }

// ownPod is a sidecar router's identifier: every call is its pod's.
func ownPod(id callers.Identity) identifier {
	return func(netip.Addr) (callers.Identity, bool) { return id, true }
}

// callerAt is the caller of a request from addr.
func (p *proxy) callerAt(addr netip.Addr) caller {
	id, ok := p.identify(addr)
	return caller{id: id, known: ok, addr: addr}
}

// callerRefused is the 403 for who, when pol does not allow it; ok when it
// does (always for a nil pol: the function lists no callers).
func callerRefused(pol *callers.Policy, who caller, ref route.Ref) (answer, bool) {
	if pol == nil || who.known && pol.Allows(who.id) {
		return answer{}, true
	}
	if !who.known {
		return answer{status: http.StatusForbidden, reason: reasonCallerUnknown, known: true,
			msg: "function " + ref.String() + " allows only the callers it lists, and no pod of the cluster holds this call's source address " + who.addr.String()}, false
	}
	return answer{status: http.StatusForbidden, reason: reasonCallerDenied, known: true,
		msg: "function " + ref.String() + " does not allow ServiceAccount " + who.id.Namespace + "/" + who.id.ServiceAccount + " (pod " + who.id.Pod + ")"}, false
}

// callerRefusal is the reason of a controller's refusal of the caller
// (PermissionDenied with a skipper.dev ErrorInfo), "" for any other error.
func callerRefusal(st *status.Status) string {
	if st.Code() != codes.PermissionDenied {
		return ""
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == callerErrorDomain &&
			(info.GetReason() == reasonCallerUnknown || info.GetReason() == reasonCallerDenied) {
			return info.GetReason()
		}
	}
	return ""
}
