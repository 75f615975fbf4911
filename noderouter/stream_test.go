package noderouter

import (
	"fmt"
	"testing"
	"time"

	"skipper.dev/skipper/internal/poll"
	"skipper.dev/skipper/noderouter/internal/routertest"
	pb "skipper.dev/skipper/proto/skipperv1"
)

func TestStream(t *testing.T) {
	t.Parallel()
	fake := startFakeController(t)
	fake.handle("default/echo", fixed(1, inst("uid-1", startEcho(t, "uid-1"))))
	h := startRouter(t, fake, nil)
	if r := h.call(t, "default/echo"); r.status != 200 {
		t.Fatalf("status %d", r.status)
	}

	poll.Until(t, pollTimeout, pollInterval, "hello and a report counting the request", fake.holds(func(f *fakeController) error {
		if len(f.hellos) == 0 || len(f.reports) == 0 {
			return fmt.Errorf("%d hellos, %d reports", len(f.hellos), len(f.reports))
		}
		fns := f.reports[len(f.reports)-1].GetFunctions()
		return poll.Unmet(len(fns) == 1 && fns[0].GetRequestsTotal() == 1, "the last report: %v", fns)
	}))
	fake.mu.Lock()
	hello := fake.hellos[0]
	rep := fake.reports[len(fake.reports)-1]
	streamed := fake.streamed[0]
	fake.mu.Unlock()
	if !streamed {
		t.Error("the first GetInstance reached the controller before the router's stream: it cannot subscribe it")
	}
	id := hello.GetRouter()
	if id.GetNode() != "node1" || id.GetPod() != "skipper-system/router-x" || id.GetIncarnation() == "" ||
		id.GetProtocolVersion() != pb.ProtocolVersion_PROTOCOL_VERSION_1 || id.GetMode() != ModeDaemonSet {
		t.Errorf("hello identity = %v", id)
	}
	fr := rep.GetFunctions()[0]
	if fr.GetGeneration() != 1 || fr.GetColdStartsTotal() != 1 || len(fr.GetInstances()) != 1 || fr.GetInstances()[0].GetRequestsTotal() != 1 {
		t.Errorf("function report = %v", fr)
	}
	if rep.GetInterval().AsDuration() != 20*time.Millisecond {
		t.Errorf("report interval = %v", rep.GetInterval())
	}

	// A newer generation moves traffic to another instance and is acked.
	fake.push <- &pb.ControllerMessage{Message: &pb.ControllerMessage_Update{Update: &pb.AssignmentUpdate{
		Function: &pb.FunctionRef{Namespace: "default", Name: "echo"}, Generation: 2,
		Instances: []*pb.Instance{inst("uid-2", startEcho(t, "uid-2"))},
	}}}
	poll.Until(t, pollTimeout, pollInterval, "ack of generation 2", fake.holds(func(f *fakeController) error {
		return poll.Unmet(len(f.acks) > 0 && f.acks[len(f.acks)-1].GetGeneration() == 2, "acks %v", f.acks)
	}))
	if got := decodeEcho(t, h.call(t, "default/echo")); got.Pod.UID != "uid-2" {
		t.Errorf("after update answered by %q, want uid-2", got.Pod.UID)
	}
	// A stale generation is ignored but acked with the one held.
	fake.push <- &pb.ControllerMessage{Message: &pb.ControllerMessage_Update{Update: &pb.AssignmentUpdate{
		Function: &pb.FunctionRef{Namespace: "default", Name: "echo"}, Generation: 1,
		Instances: []*pb.Instance{inst("uid-1", "127.0.0.1:1")},
	}}}
	poll.Until(t, pollTimeout, pollInterval, "second ack", fake.holds(func(f *fakeController) error { return poll.Unmet(len(f.acks) == 2, "%d acks", len(f.acks)) }))
	fake.mu.Lock()
	if g := fake.acks[1].GetGeneration(); g != 2 {
		t.Errorf("stale update acked with generation %d, want 2", g)
	}
	fake.mu.Unlock()

	// Removal drops the set: the next request asks again.
	fake.push <- &pb.ControllerMessage{Message: &pb.ControllerMessage_Update{Update: &pb.AssignmentUpdate{
		Function: &pb.FunctionRef{Namespace: "default", Name: "echo"}, Generation: 3, Removed: true,
	}}}
	poll.Until(t, pollTimeout, pollInterval, "ack of the removal", fake.holds(func(f *fakeController) error { return poll.Unmet(len(f.acks) == 3, "%d acks", len(f.acks)) }))
	if r := h.call(t, "default/echo"); r.status != 200 {
		t.Fatalf("after removal: %d", r.status)
	}
	if got := len(fake.getCalls()); got != 2 {
		t.Errorf("GetInstance calls = %d, want 2", got)
	}
}

func TestStreamReconnects(t *testing.T) {
	t.Parallel()
	fake := startFakeController(t)
	fake.failConnects = 2
	fake.handle("default/echo", fixed(1, inst("uid-1", startEcho(t, "uid-1"))))
	h := startRouter(t, fake, nil)
	if r := h.call(t, "default/echo"); r.status != 200 {
		t.Fatalf("status %d", r.status)
	}
	poll.Until(t, pollTimeout, pollInterval, "a hello after two failed connects", fake.holds(func(f *fakeController) error { return poll.Unmet(len(f.hellos) == 1, "%d hellos", len(f.hellos)) }))
	if got := routertest.Counter(h.rt.m.reconnects); got < 2 {
		t.Errorf("stream_reconnects_total = %v, want ≥ 2", got)
	}

	// The next stream re-subscribes to what the router holds.
	fake.kick <- struct{}{}
	poll.Until(t, pollTimeout, pollInterval, "a second hello", fake.holds(func(f *fakeController) error { return poll.Unmet(len(f.hellos) == 2, "%d hellos", len(f.hellos)) }))
	fake.mu.Lock()
	subs := fake.hellos[1].GetSubscriptions()
	fake.mu.Unlock()
	if len(subs) != 1 || subs[0].GetFunction().GetName() != "echo" || subs[0].GetGeneration() != 1 {
		t.Errorf("hello subscriptions = %v", subs)
	}
	if r := h.call(t, "default/echo"); r.status != 200 || len(fake.getCalls()) != 1 {
		t.Errorf("warm call across a reconnect: %d, %d GetInstance calls", r.status, len(fake.getCalls()))
	}
}
