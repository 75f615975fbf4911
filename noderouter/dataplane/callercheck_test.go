package dataplane

import (
	"net/netip"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"skipper.dev/skipper/noderouter/callers"
	"skipper.dev/skipper/noderouter/internal/routertest"
	"skipper.dev/skipper/noderouter/route"
)

func TestCallerRefused(t *testing.T) {
	t.Parallel()
	ref := route.Ref{Namespace: "default", Name: "private"}
	pol := callers.NewPolicy([]string{"team-a"}, []string{"team-b/web"})
	a := callers.Identity{Namespace: "team-a", ServiceAccount: "default", Pod: "team-a/x"}
	b := callers.Identity{Namespace: "team-b", ServiceAccount: "batch", Pod: "team-b/y"}
	addr := netip.MustParseAddr("10.0.0.9")
	for _, tt := range []struct {
		name   string
		pol    *callers.Policy
		who    Caller
		reason string
	}{
		{"no callers: unknown allowed", nil, Caller{Addr: addr}, ""},
		{"listed namespace", pol, Caller{ID: a, Known: true}, ""},
		{"unlisted account", pol, Caller{ID: b, Known: true}, ReasonCallerDenied},
		{"unknown", pol, Caller{Addr: addr}, ReasonCallerUnknown},
	} {
		ans, ok := callerRefused(tt.pol, tt.who, ref)
		if ok != (tt.reason == "") || ans.reason != tt.reason {
			t.Errorf("%s: %v %+v, want reason %q", tt.name, ok, ans, tt.reason)
		}
		if !ok && (ans.status != 403 || !ans.known) {
			t.Errorf("%s: status %d known %v, want a 403 counted on the function", tt.name, ans.status, ans.known)
		}
	}
}

func TestControllerCallerRefusalIs403(t *testing.T) {
	t.Parallel()
	for _, r := range []string{ReasonCallerUnknown, ReasonCallerDenied} {
		ans, res := controllerAnswer(routertest.CallerRefusal(r))
		if ans.status != 403 || ans.reason != r || res != ResultCallerRefused {
			t.Errorf("%s: %+v %s", r, ans, res)
		}
	}
	// Another PermissionDenied (this router's own token refused) is the
	// control plane failing this router, not the caller.
	if ans, _ := controllerAnswer(status.Error(codes.PermissionDenied, "not a router")); ans.status != 503 {
		t.Errorf("a router refused: %+v, want 503", ans)
	}
}
