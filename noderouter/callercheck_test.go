package noderouter

import (
	"context"
	"encoding/json"
	"net/http"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"

	"skipper.dev/skipper/noderouter/callers"
	"skipper.dev/skipper/noderouter/dataplane"
	"skipper.dev/skipper/noderouter/internal/routertest"
	"skipper.dev/skipper/noderouter/route"
	pb "skipper.dev/skipper/proto/skipperv1"
)

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
		return nil, routertest.CallerRefusal(dataplane.ReasonCallerDenied)
	})
	fake.handle("default/open", fixed(1, inst("uid-1", addr)))
	var who atomic.Pointer[callers.Identity]
	h := startRouter(t, fake, nil, func(rt *router) {
		rt.proxy.SetIdentify(func(ip netip.Addr) (callers.Identity, bool) {
			if id := who.Load(); id != nil && ip == netip.MustParseAddr("127.0.0.1") {
				return *id, true
			}
			return callers.Identity{}, false
		})
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
		r := h.do(t, "GET", "/hello", map[string]string{"X-Skipper-Function": fn, dataplane.HeaderCaller: "forged/admin"}, "")
		if r.status != want {
			t.Fatalf("%s: %d %s, want %d", fn, r.status, r.body, want)
		}
		if want == 200 {
			got := decodeEcho(t, r).Headers[dataplane.HeaderCaller]
			wantCaller := []string(nil)
			if fn == "default/private" {
				wantCaller = []string{who.Load().Account} // the instance is told who calls
			}
			if !slices.Equal(got, wantCaller) {
				t.Fatalf("%s: the instance saw %s %q, want %q", fn, dataplane.HeaderCaller, got, wantCaller)
			}
		}
		if reason == "" {
			return
		}
		var body routertest.ErrorBody
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
	handovers := func() float64 { return routertest.Value(t, h.rt.m.reg, "skipper_noderouter_loop_handovers_total") }
	before := handovers()
	as("team-b")
	expect("default/private", 403, dataplane.ReasonCallerDenied) // warm, refused by the router
	as("")
	expect("default/private", 403, dataplane.ReasonCallerUnknown)
	refusedHandovers := handovers() - before
	expect("default/open", 200, "") // a function that lists no callers takes anyone
	if n := len(fake.getCalls()); n != 2 {
		t.Errorf("%d GetInstance calls, want 2 (one per function): refusals of a cached function ask nothing", n)
	}
	m := h.rt.m
	if d, u := routertest.Value(t, m.reg, "skipper_noderouter_rejected_total", "reason", dataplane.ReasonCallerDenied), routertest.Value(t, m.reg, "skipper_noderouter_rejected_total", "reason", dataplane.ReasonCallerUnknown); d != 1 || u != 1 {
		t.Errorf("rejected_total caller_denied %v caller_unknown %v, want 1 and 1", d, u)
	}
	if testForwarder == dataplane.ForwarderLoop {
		if refusedHandovers != 0 {
			t.Errorf("the loop handed %v refused requests over, want 0: the pipeline refuses them where they were read", refusedHandovers)
		}
	}
	if got := routertest.Value(t, m.reg, "skipper_noderouter_requests_total", "function", "default/private", "code", "403"); got != 2 {
		t.Errorf("requests_total{default/private,403} = %v, want 2", got)
	}

	// A cold function the owner refuses this caller for: its 403, and
	// nothing cached.
	as("team-c")
	expect("default/private-too", 403, dataplane.ReasonCallerDenied)
	if e, _ := h.rt.cache.Lookup(route.Ref{Namespace: "default", Name: "private-too"}); e != nil {
		t.Error("a refused GetInstance left a cache entry")
	}
}
