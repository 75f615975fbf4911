package dataplane

import (
	"net/http"
	"net/netip"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"skipper.dev/skipper/noderouter/callers"
	"skipper.dev/skipper/noderouter/route"
)

// Reasons of the 403s of spec.callers (the controller's PermissionDenied
// carries the same in an ErrorInfo of domain skipper.dev).
const (
	ReasonCallerUnknown = "caller_unknown"
	ReasonCallerDenied  = "caller_denied"
	callerErrorDomain   = "skipper.dev"
)

// Caller is who a request came from, as far as the router can tell: the
// pod holding the connection's source address (a DaemonSet router's caller
// index), or a sidecar router's own pod.
type Caller struct {
	ID    callers.Identity
	Known bool
	Addr  netip.Addr // the source address, for the answers
}

// Key tells identities apart for calls shared by callers of one function.
func (c Caller) Key() string {
	if !c.Known {
		return ""
	}
	return c.ID.Namespace + "/" + c.ID.ServiceAccount
}

// Identifier finds who holds a source address.
type Identifier func(netip.Addr) (callers.Identity, bool)

// unknownCaller is the Identifier of a router without a caller index.
func unknownCaller(netip.Addr) (callers.Identity, bool) { return callers.Identity{}, false }

// OwnPod is a sidecar router's Identifier: every call is its pod's.
func OwnPod(id callers.Identity) Identifier {
	return func(netip.Addr) (callers.Identity, bool) { return id, true }
}

// callerAt is the caller of a request from addr.
func (p *Proxy) callerAt(addr netip.Addr) Caller {
	id, ok := p.identify(addr)
	return Caller{ID: id, Known: ok, Addr: addr}
}

// callerRefused is the 403 for who, when pol does not allow it; ok when it
// does (always for a nil pol: the function lists no callers).
func callerRefused(pol *callers.Policy, who Caller, ref route.Ref) (answer, bool) {
	if pol == nil || who.Known && pol.Allows(who.ID) {
		return answer{}, true
	}
	if !who.Known {
		return answer{status: http.StatusForbidden, reason: ReasonCallerUnknown, known: true,
			msg: "function " + ref.String() + " allows only the callers it lists, and no pod of the cluster holds this call's source address " + who.Addr.String()}, false
	}
	return answer{status: http.StatusForbidden, reason: ReasonCallerDenied, known: true,
		msg: "function " + ref.String() + " does not allow ServiceAccount " + who.ID.Namespace + "/" + who.ID.ServiceAccount + " (pod " + who.ID.Pod + ")"}, false
}

// callerRefusal is the reason of a controller's refusal of the caller
// (PermissionDenied with a skipper.dev ErrorInfo), "" for any other error.
func callerRefusal(st *status.Status) string {
	if st.Code() != codes.PermissionDenied {
		return ""
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == callerErrorDomain &&
			(info.GetReason() == ReasonCallerUnknown || info.GetReason() == ReasonCallerDenied) {
			return info.GetReason()
		}
	}
	return ""
}
