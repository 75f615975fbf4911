package controller

import (
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	skipperv1 "skipper.dev/skipper/proto/skipperv1"
)

func upd(name string, gen uint64) *skipperv1.AssignmentUpdate {
	return &skipperv1.AssignmentUpdate{Function: &skipperv1.FunctionRef{Namespace: "default", Name: name}, Generation: gen}
}

func TestHubPublishesToSubscribersNewestOnly(t *testing.T) {
	t.Parallel()
	h := newHub()
	a := mustRegister(t, h, &skipperv1.RouterIdentity{Pod: "skipper-system/router-a", Incarnation: "1"})
	b := mustRegister(t, h, &skipperv1.RouterIdentity{Pod: "skipper-system/router-b", Incarnation: "1"})
	h.subscribe(a.id, "default/f")
	h.subscribe(&skipperv1.RouterIdentity{Pod: "skipper-system/unknown"}, "default/f") // no stream: ignored

	h.publish("default/f", upd("f", 1))
	h.publish("default/f", upd("f", 2)) // a slow router gets only the newest
	h.publish("default/g", upd("g", 1)) // nobody subscribed

	if diff := cmp.Diff([]*skipperv1.AssignmentUpdate{upd("f", 2)}, a.take(), protocmp.Transform()); diff != "" {
		t.Errorf("router a (-want +got):\n%s", diff)
	}
	if got := b.take(); len(got) != 0 {
		t.Errorf("router b got %v, want nothing", got)
	}
	select {
	case <-a.wake:
	default:
		t.Error("router a was not woken")
	}

	// A removal unsubscribes.
	h.publish("default/f", removedUpdate("default", "f", 3))
	_ = a.take()
	h.publish("default/f", upd("f", 4))
	if got := a.take(); len(got) != 0 {
		t.Errorf("after removal router a got %v", got)
	}
}

func TestHubReplacesStreamOfSameRouterProcess(t *testing.T) {
	t.Parallel()
	h := newHub()
	id := &skipperv1.RouterIdentity{Pod: "skipper-system/router-a", Incarnation: "1"}
	old := mustRegister(t, h, id)
	cur := mustRegister(t, h, id)
	select {
	case <-old.replaced:
	default:
		t.Fatal("old stream not told it was replaced")
	}
	h.unregister(old) // the old handler's deferred unregister must not drop the new one
	h.subscribe(id, "default/f")
	h.publish("default/f", upd("f", 1))
	if len(cur.take()) != 1 {
		t.Error("the new stream lost its registration")
	}
	// A new incarnation is a different router process: both live.
	other := mustRegister(t, h, &skipperv1.RouterIdentity{Pod: "skipper-system/router-a", Incarnation: "2"})
	select {
	case <-cur.replaced:
		t.Error("a new incarnation replaced the old one's stream")
	default:
	}
	if len(h.states()) != 2 || other == nil {
		t.Errorf("states = %v", h.states())
	}
}

func mustRegister(t *testing.T, h *hub, id *skipperv1.RouterIdentity) *routerStream {
	t.Helper()
	s, err := h.register(id)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestHubBoundsStreams(t *testing.T) {
	t.Parallel()
	h := newHub()
	for i := range maxStreams {
		mustRegister(t, h, &skipperv1.RouterIdentity{Pod: fmt.Sprintf("ns/r%d", i), Incarnation: "1"})
	}
	if _, err := h.register(&skipperv1.RouterIdentity{Pod: "ns/one-more", Incarnation: "1"}); !errors.Is(err, ErrTooManyStreams) {
		t.Fatalf("stream %d: %v, want ErrTooManyStreams", maxStreams+1, err)
	}
	// A router process reconnecting replaces its own stream: always let in.
	mustRegister(t, h, &skipperv1.RouterIdentity{Pod: "ns/r0", Incarnation: "1"})
}
