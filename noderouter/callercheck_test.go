package noderouter

import (
	"context"
	"encoding/json"
	"net/http"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"skipper.dev/skipper/noderouter/callers"
	"skipper.dev/skipper/noderouter/route"
	pb "skipper.dev/skipper/proto/skipperv1"
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
		who    caller
		reason string
	}{
		{"no callers: unknown allowed", nil, caller{addr: addr}, ""},
		{"listed namespace", pol, caller{id: a, known: true}, ""},
		{"unlisted account", pol, caller{id: b, known: true}, reasonCallerDenied},
		{"unknown", pol, caller{addr: addr}, reasonCallerUnknown},
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

// refusal is the controller's PermissionDenied for a caller.
func refusal(reason string) error {
	st, _ := status.New(codes.PermissionDenied, reason+": refused").WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: callerErrorDomain})
	return st.Err()
}

func TestControllerCallerRefusalIs403(t *testing.T) {
	t.Parallel()
	for _, r := range []string{reasonCallerUnknown, reasonCallerDenied} {
		ans, res := controllerAnswer(refusal(r))
		if ans.status != 403 || ans.reason != r || res != resultCallerRefused {
			t.Errorf("%s: %+v %s", r, ans, res)
		}
	}
	// Another PermissionDenied (this router's own token refused) is the
	// control plane failing this router, not the caller.
	if ans, _ := controllerAnswer(status.Error(codes.PermissionDenied, "not a router")); ans.status != 503 {
		t.Errorf("a router refused: %+v, want 503", ans)
	}
}

// TestCallersChecked runs spec.callers through the router: the caller's
// identity goes with GetInstance, a cached assignment's callers are
// checked on every request (warm ones on the event loops too), and a
// refusal is a JSON 403 counted by reason.
func TestCallersChecked(t *testing.T) {
	t.Parallel()
	fake := startFakeController(t)
	addr := startEcho(t, "uid-1")
	fake.handle("default/private", func(_ context.Context, req *pb.GetInstanceRequest) (*pb.GetInstanceResponse, error) {
		return &pb.GetInstanceResponse{Function: req.GetFunction(), Generation: 1, Instances: []*pb.Instance{inst("uid-1", addr)},
			Config: &pb.FunctionConfig{Callers: &pb.Callers{Namespaces: []string{"team-a"}}}}, nil
	})
	fake.handle("default/private-too", func(context.Context, *pb.GetInstanceRequest) (*pb.GetInstanceResponse, error) {
		return nil, refusal(reasonCallerDenied)
	})
	fake.handle("default/open", fixed(1, inst("uid-1", addr)))
	var who atomic.Pointer[callers.Identity]
	h := startRouter(t, fake, nil, func(rt *router) {
		rt.proxy.identify = func(ip netip.Addr) (callers.Identity, bool) {
			if id := who.Load(); id != nil && ip == netip.MustParseAddr("127.0.0.1") {
				return *id, true
			}
			return callers.Identity{}, false
		}
	})
	as := func(ns string) {
		if ns == "" {
			who.Store(nil)
			return
		}
		id := callers.NewIdentity(ns, "default", "caller")
		who.Store(&id)
	}
	expect := func(fn string, want int, reason string) {
		t.Helper()
		// A new connection each time: one handed over (a cold call) stays
		// on the goroutine path, and the event loops are to be seen too.
		h.client.Transport.(*http.Transport).CloseIdleConnections()
		// A caller's own X-Skipper-Caller never reaches an instance.
		r := h.do(t, "GET", "/hello", map[string]string{"X-Skipper-Function": fn, HeaderCaller: "forged/admin"}, "")
		if r.status != want {
			t.Fatalf("%s: %d %s, want %d", fn, r.status, r.body, want)
		}
		if want == 200 {
			got := decodeEcho(t, r).Headers[HeaderCaller]
			wantCaller := []string(nil)
			if fn == "default/private" {
				wantCaller = []string{who.Load().Account} // the instance is told who calls
			}
			if !slices.Equal(got, wantCaller) {
				t.Fatalf("%s: the instance saw %s %q, want %q", fn, HeaderCaller, got, wantCaller)
			}
		}
		if reason == "" {
			return
		}
		var body errorBody
		if err := json.Unmarshal(r.body, &body); err != nil || body.Reason != reason || body.Function != fn {
			t.Fatalf("%s: body %s (%v), want reason %s", fn, r.body, err, reason)
		}
	}

	as("team-a")
	expect("default/private", 200, "") // cold: GetInstance with the caller
	if c := fake.getCalls()[0].GetCaller(); c.GetNamespace() != "team-a" || c.GetServiceAccount() != "default" || c.GetPod() != "team-a/caller" {
		t.Errorf("GetInstance caller = %v", c)
	}
	expect("default/private", 200, "") // warm
	handovers := func() (n float64) {
		for _, c := range h.rt.m.handovers {
			n += counter(c)
		}
		return n
	}
	before := handovers()
	as("team-b")
	expect("default/private", 403, reasonCallerDenied) // warm, refused by the router
	as("")
	expect("default/private", 403, reasonCallerUnknown)
	refusedHandovers := handovers() - before
	expect("default/open", 200, "") // a function that lists no callers takes anyone
	if n := len(fake.getCalls()); n != 2 {
		t.Errorf("%d GetInstance calls, want 2 (one per function): refusals of a cached function ask nothing", n)
	}
	m := h.rt.m
	if d, u := counter(m.rejected.WithLabelValues(reasonCallerDenied)), counter(m.rejected.WithLabelValues(reasonCallerUnknown)); d != 1 || u != 1 {
		t.Errorf("rejected_total caller_denied %v caller_unknown %v, want 1 and 1", d, u)
	}
	if testForwarder == forwarderLoop {
		if refusedHandovers != 0 {
			t.Errorf("the loop handed %v refused requests over, want 0: the pipeline refuses them where they were read", refusedHandovers)
		}
	}
	if got := counter(m.requests.WithLabelValues("default/private", "403")); got != 2 {
		t.Errorf("requests_total{default/private,403} = %v, want 2", got)
	}

	// A cold function the owner refuses this caller for: its 403, and
	// nothing cached.
	as("team-c")
	expect("default/private-too", 403, reasonCallerDenied)
	if e, _ := h.rt.cache.Lookup(route.Ref{Namespace: "default", Name: "private-too"}); e != nil {
		t.Error("a refused GetInstance left a cache entry")
	}
}
