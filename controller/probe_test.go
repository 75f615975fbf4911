package controller

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/internal/poll"
	skipperv1 "skipper.dev/skipper/proto/skipperv1"
)

// TestReportedPoolPodAdopted (issue 15 item 3): a router reports an
// instance of a function that is still a pool pod here (its claim's
// record never landed: the claiming controller died). The owner asks the
// instance what it holds and records it for that function; a reported
// pool pod whose instance holds nothing is left in the pool.
func TestReportedPoolPodAdopted(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	fn := e.fnFor("hello", "echo")
	fn.Spec.MinInstances = 0
	e.add(poolDeploy("echo"), fn, poolPod("p1", "echo"), poolPod("p2", "echo"))
	e.holdsFunction("uid-p1", "default/hello") // assigned, not recorded
	r := startReplica(t, e, "ctl-0", nil, func(c *Config) { c.ReportInterval = 100 * time.Millisecond })

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	id := &skipperv1.RouterIdentity{Node: "node-1", Pod: "skipper-system/router-x", Incarnation: "i1", ProtocolVersion: skipperv1.ProtocolVersion_PROTOCOL_VERSION_1}
	stream, _ := helloStream(t, ctx, r, id)
	go func() { // drain the updates
		for {
			if _, err := stream.Recv(); err != nil {
				return
			}
		}
	}()
	seq := uint64(0)
	poll.Until(t, 10*time.Second, 100*time.Millisecond, "p1, reported by the router and holding hello, recorded for it", func(context.Context) error {
		seq++
		rep := &skipperv1.Report{Sequence: seq, Time: timestamppb.Now(), Functions: []*skipperv1.FunctionReport{{
			Function: &skipperv1.FunctionRef{Namespace: "default", Name: "hello"},
			// No load: the function is not scaled up, so no claim meets p1.
			Instances: []*skipperv1.InstanceReport{{Pod: "p1", PodUid: "uid-p1"}, {Pod: "p2", PodUid: "uid-p2"}},
		}}}
		if err := stream.Send(&skipperv1.RouterMessage{Message: &skipperv1.RouterMessage_Report{Report: rep}}); err != nil {
			t.Fatal(err)
		}
		if l := e.pod("p1").Labels[v1alpha1.LabelFunction]; l != "hello" {
			return fmt.Errorf("p1 labelled %q", l)
		}
		return nil
	})
	if !ownedBy(e.pod("p1"), fn) {
		t.Errorf("p1 recorded without hello's ownerReference: %v", e.pod("p1").OwnerReferences)
	}
	// p2 was asked too (its instance holds nothing): no assign was sent to
	// it for a report, and it is still in the pool unless a claim took it.
	for _, req := range e.assignRequests() {
		if tokenAudience(req.Token) == "uid-p1" {
			t.Errorf("p1 was assigned (%+v): adoption only records what the instance holds", req)
		}
	}
}
