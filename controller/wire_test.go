package controller

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"skipper.dev/skipper/controller/scaling"
	"skipper.dev/skipper/internal/poll"
	skipperv1 "skipper.dev/skipper/proto/skipperv1"
)

func ref(ns, name string) *skipperv1.FunctionRef {
	return &skipperv1.FunctionRef{Namespace: ns, Name: name}
}

// violated returns the violated fields with their counts.
func violated(v violations) map[string]int {
	if len(v) == 0 {
		return nil
	}
	out := map[string]int{}
	for f, n := range v {
		out[f] = n.Count
	}
	return out
}

// wantViolations fails t, naming the violations, unless v holds exactly
// the fields and counts of want (nil for none).
func wantViolations(t *testing.T, want map[string]int, v violations) {
	t.Helper()
	if diff := cmp.Diff(want, violated(v)); diff != "" {
		t.Errorf("violations (-want +got):\n%s\n%s", diff, v)
	}
}

func TestCheckReport(t *testing.T) {
	t.Parallel()
	now := t0
	hello := func(mod func(*skipperv1.FunctionReport)) *skipperv1.FunctionReport {
		fr := &skipperv1.FunctionReport{Function: ref("default", "hello"), InFlight: 3, Queued: 1, RequestsTotal: 10, Generation: 7}
		if mod != nil {
			mod(fr)
		}
		return fr
	}
	helloWant := wireFunction{Key: "default/hello", Generation: 7, InFlight: 3, Queued: 1, Counters: scaling.Counters{Requests: 10}}
	tests := []struct {
		name       string
		report     *skipperv1.Report
		want       wireReport
		violations map[string]int
	}{
		{
			name:   "valid report applies as sent",
			report: &skipperv1.Report{Sequence: 4, Time: timestamppb.New(now.Add(-time.Second)), Functions: []*skipperv1.FunctionReport{hello(nil)}},
			want:   wireReport{Sequence: 4, Sent: now.Add(-time.Second), Functions: []wireFunction{helloWant}},
		},
		{
			name:       "a timestamp from the future is re-stamped with the receive time",
			report:     &skipperv1.Report{Sequence: 4, Time: timestamppb.New(now.Add(maxClockSkew + time.Millisecond)), Functions: []*skipperv1.FunctionReport{hello(nil)}},
			want:       wireReport{Sequence: 4, Sent: now, Functions: []wireFunction{helloWant}},
			violations: map[string]int{fieldSent: 1},
		},
		{
			name:   "a timestamp within the skew stands",
			report: &skipperv1.Report{Time: timestamppb.New(now.Add(maxClockSkew))},
			want:   wireReport{Sent: now.Add(maxClockSkew)},
		},
		{
			name:       "a timestamp too far in the past is re-stamped",
			report:     &skipperv1.Report{Time: timestamppb.New(now.Add(-maxReportAge - time.Second))},
			want:       wireReport{Sent: now},
			violations: map[string]int{fieldSent: 1},
		},
		{
			name:       "a missing timestamp is re-stamped",
			report:     &skipperv1.Report{},
			want:       wireReport{Sent: now},
			violations: map[string]int{fieldSent: 1},
		},
		{
			name:       "an invalid timestamp is re-stamped",
			report:     &skipperv1.Report{Time: &timestamppb.Timestamp{Seconds: math.MaxInt64}},
			want:       wireReport{Sent: now},
			violations: map[string]int{fieldSent: 1},
		},
		{
			name: "huge gauges and counters drop the function's report",
			report: &skipperv1.Report{Time: timestamppb.New(now), Functions: []*skipperv1.FunctionReport{
				hello(func(fr *skipperv1.FunctionReport) { fr.InFlight = math.MaxUint32 }),
				hello(func(fr *skipperv1.FunctionReport) { fr.Queued = maxGauge + 1 }),
				hello(func(fr *skipperv1.FunctionReport) {
					fr.RequestsTotal, fr.ColdStartsTotal = math.MaxUint64, maxCounter+1
				}),
				hello(func(fr *skipperv1.FunctionReport) {
					fr.InFlight, fr.Queued, fr.ErrorsTotal = maxGauge, maxGauge, maxCounter
				}),
			}},
			want: wireReport{Sent: now, Functions: []wireFunction{{
				Key: "default/hello", Generation: 7, InFlight: maxGauge, Queued: maxGauge, Counters: scaling.Counters{Requests: 10, Errors: maxCounter},
			}}},
			violations: map[string]int{fieldInFlight: 1, fieldQueued: 1, fieldCounters: 2},
		},
		{
			name: "invalid function references are dropped",
			report: &skipperv1.Report{Time: timestamppb.New(now), Functions: []*skipperv1.FunctionReport{
				{Function: ref("", "hello")}, {Function: ref("default", "Hello")}, {}, {Function: ref(strings.Repeat("a", 64), "x")},
				{Function: ref("default", strings.Repeat("b", 1<<20))},
			}},
			want:       wireReport{Sent: now},
			violations: map[string]int{fieldFunction: 5},
		},
		{
			name: "instance samples out of bounds are dropped, the rest kept",
			report: &skipperv1.Report{Time: timestamppb.New(now), Functions: []*skipperv1.FunctionReport{hello(func(fr *skipperv1.FunctionReport) {
				fr.Instances = []*skipperv1.InstanceReport{
					{PodUid: "a", InFlight: 2, CpuMillicores: proto.Uint64(250), MemoryBytes: proto.Uint64(1 << 20)},
					{PodUid: "b", InFlight: math.MaxUint32},
					{PodUid: "", InFlight: 1},
					{PodUid: strings.Repeat("u", maxUIDLen+1)},
					{PodUid: "c", CpuMillicores: proto.Uint64(math.MaxUint64), MemoryBytes: proto.Uint64(math.MaxUint64)},
					{PodUid: "d", CpuMillicores: proto.Uint64(maxCPUMilli), MemoryBytes: proto.Uint64(maxMemoryBytes)},
				}
			})}},
			want: wireReport{Sent: now, Functions: []wireFunction{func() wireFunction {
				w := helloWant
				w.Instances = []scaling.InstanceReport{
					{PodUID: "a", InFlight: 2, CPUMilli: 250, HasCPU: true, MemoryBytes: 1 << 20, HasMemory: true},
					{PodUID: "c"},
					{PodUID: "d", CPUMilli: maxCPUMilli, HasCPU: true, MemoryBytes: maxMemoryBytes, HasMemory: true},
				}
				return w
			}()}},
			violations: map[string]int{fieldInstanceInFlight: 1, fieldPodUID: 2, fieldCPU: 1, fieldMemory: 1},
		},
		{
			name: "instances past the bound are not applied",
			report: &skipperv1.Report{Time: timestamppb.New(now), Functions: []*skipperv1.FunctionReport{hello(func(fr *skipperv1.FunctionReport) {
				for range maxReportInstances + 5 {
					fr.Instances = append(fr.Instances, &skipperv1.InstanceReport{PodUid: "x"})
				}
			})}},
			want: wireReport{Sent: now, Functions: []wireFunction{func() wireFunction {
				w := helloWant
				w.Instances = slices.Repeat([]scaling.InstanceReport{{PodUID: "x"}}, maxReportInstances)
				return w
			}()}},
			violations: map[string]int{fieldInstances: 1},
		},
		{
			name: "functions past the bound are not applied",
			report: &skipperv1.Report{Time: timestamppb.New(now), Functions: append(
				slices.Repeat([]*skipperv1.FunctionReport{{Function: ref("default", "f")}}, maxReportFunctions), hello(nil))},
			want:       wireReport{Sent: now, Functions: slices.Repeat([]wireFunction{{Key: "default/f"}}, maxReportFunctions)},
			violations: map[string]int{fieldFunctions: 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, v := checkReport(tt.report, now)
			if diff := cmp.Diff(tt.want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("checkReport (-want +got):\n%s", diff)
			}
			wantViolations(t, tt.violations, v)
		})
	}
}

func TestCheckHello(t *testing.T) {
	t.Parallel()
	router := &skipperv1.RouterIdentity{Node: "node-1", Pod: "skipper-system/router-a", Incarnation: "0123456789abcdef", Mode: "daemonset"}
	sub := func(ns, name string, gen uint64) *skipperv1.Subscription {
		return &skipperv1.Subscription{Function: ref(ns, name), Generation: gen}
	}
	tests := []struct {
		name       string
		hello      *skipperv1.Hello
		want       []wireSub
		violations map[string]int
		wantErr    bool
	}{
		{
			name:  "valid",
			hello: &skipperv1.Hello{Router: router, Subscriptions: []*skipperv1.Subscription{sub("default", "a", 3), sub("ns2", "b.v2", 0)}},
			want:  []wireSub{{Key: "default/a", Generation: 3}, {Key: "ns2/b.v2"}},
		},
		{name: "router name without namespace", hello: &skipperv1.Hello{Router: &skipperv1.RouterIdentity{Pod: "router-a"}}},
		{name: "no router", hello: &skipperv1.Hello{}, violations: map[string]int{fieldRouter: 1}, wantErr: true},
		{
			name:       "invalid router pod",
			hello:      &skipperv1.Hello{Router: &skipperv1.RouterIdentity{Pod: "Skipper/Router A"}},
			violations: map[string]int{fieldRouter: 1}, wantErr: true,
		},
		{
			name: "invalid node, incarnation and mode",
			hello: &skipperv1.Hello{Router: &skipperv1.RouterIdentity{Pod: "r", Node: strings.Repeat("n", 254),
				Incarnation: strings.Repeat("i", maxIncarnationLen+1), Mode: strings.Repeat("m", maxIncarnationLen+1)}},
			violations: map[string]int{fieldRouter: 3}, wantErr: true,
		},
		{
			name:       "invalid subscriptions are dropped",
			hello:      &skipperv1.Hello{Router: router, Subscriptions: []*skipperv1.Subscription{sub("default", "a", 1), sub("", "b", 1), {}, sub("default", "a/b", 1)}},
			want:       []wireSub{{Key: "default/a", Generation: 1}},
			violations: map[string]int{fieldFunction: 3},
		},
		{
			name:       "subscriptions past the bound are not applied",
			hello:      &skipperv1.Hello{Router: router, Subscriptions: slices.Repeat([]*skipperv1.Subscription{sub("default", "a", 1)}, maxSubscriptions+3)},
			want:       slices.Repeat([]wireSub{{Key: "default/a", Generation: 1}}, maxSubscriptions),
			violations: map[string]int{fieldSubscriptions: 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, v, err := checkHello(tt.hello)
			if (err != nil) != tt.wantErr {
				t.Fatalf("checkHello error = %v, want error %v", err, tt.wantErr)
			}
			if err != nil && grpcStatus(err).Code() != codes.InvalidArgument {
				t.Errorf("code = %v, want InvalidArgument", grpcStatus(err).Code())
			}
			if diff := cmp.Diff(tt.want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("subscriptions (-want +got):\n%s", diff)
			}
			wantViolations(t, tt.violations, v)
		})
	}
}

func TestCheckUnaryRequests(t *testing.T) {
	t.Parallel()
	uids := func(n, size int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = strings.Repeat("u", size)
		}
		return out
	}
	tests := []struct {
		name       string
		v          violations
		violations map[string]int
	}{
		{name: "GetInstance valid", v: checkGetInstance(&skipperv1.GetInstanceRequest{
			Function: ref("default", "a"), Router: &skipperv1.RouterIdentity{Pod: "r", Node: "n"}, UnusablePodUids: uids(maxUnusable, 36)})},
		{name: "GetInstance without router", v: checkGetInstance(&skipperv1.GetInstanceRequest{Function: ref("default", "a")})},
		{
			name:       "GetInstance with too many unusable UIDs",
			v:          checkGetInstance(&skipperv1.GetInstanceRequest{UnusablePodUids: uids(maxUnusable+1, 36)}),
			violations: map[string]int{fieldUnusable: 1},
		},
		{
			name:       "GetInstance with oversized UIDs and router",
			v:          checkGetInstance(&skipperv1.GetInstanceRequest{Router: &skipperv1.RouterIdentity{Pod: "a_b"}, UnusablePodUids: uids(2, maxUIDLen+1)}),
			violations: map[string]int{fieldPodUID: 2, fieldRouter: 1},
		},
		{name: "ReleaseInstance valid", v: checkRelease(&skipperv1.ReleaseInstanceRequest{PodUid: "uid-1", Router: &skipperv1.RouterIdentity{Pod: "r"}})},
		{
			name:       "ReleaseInstance with an oversized UID",
			v:          checkRelease(&skipperv1.ReleaseInstanceRequest{PodUid: strings.Repeat("u", maxUIDLen+1)}),
			violations: map[string]int{fieldPodUID: 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantViolations(t, tt.violations, tt.v)
			err := tt.v.err("Call")
			if (err != nil) != (len(tt.violations) > 0) {
				t.Fatalf("err = %v, want one iff there are violations", err)
			}
			if err != nil && grpcStatus(err).Code() != codes.InvalidArgument {
				t.Errorf("code = %v, want InvalidArgument", grpcStatus(err).Code())
			}
		})
	}
}

func TestCheckAck(t *testing.T) {
	t.Parallel()
	if key, gen, v, ok := checkAck(&skipperv1.Ack{Function: ref("default", "a"), Generation: 9}); !ok || key != "default/a" || gen != 9 || v != nil {
		t.Errorf("valid ack: %q %d %v %v", key, gen, v, ok)
	}
	if _, _, v, ok := checkAck(&skipperv1.Ack{Function: ref("default", strings.Repeat("a", 300))}); ok || v[fieldFunction].Count != 1 {
		t.Errorf("invalid ack applied: %v %v", v, ok)
	}
}

// TestRouterStreamLogsEachFieldOnce checks that a router's violations are
// logged once per field, however often they repeat or it reconnects, and
// that its stream's state
// stays bounded: acks only for subscribed functions, at most
// maxSubscriptions subscriptions.
func TestRouterStreamLogsEachFieldOnceAndStaysBounded(t *testing.T) {
	t.Parallel()
	h := newHub()
	rs := mustRegister(t, h, &skipperv1.RouterIdentity{Pod: "r", Incarnation: "1"})
	var v violations
	v.add(fieldInFlight, "x")
	v.add(fieldSent, "y")
	if got := h.unlogged("r", v); len(got) != 2 {
		t.Errorf("first time: %v, want both fields", got)
	}
	v.add(fieldQueued, "z")
	if diff := cmp.Diff(map[string]int{fieldQueued: 1}, violated(h.unlogged("r", v))); diff != "" {
		t.Errorf("second time (-want +got):\n%s", diff)
	}
	if got := h.unlogged("r", v); got != nil {
		t.Errorf("third time: %v, want nothing", got)
	}
	// The router reconnects: still logged.
	mustRegister(t, h, &skipperv1.RouterIdentity{Pod: "r", Incarnation: "2"})
	if got := h.unlogged("r", v); got != nil {
		t.Errorf("after a reconnect: %v, want nothing", got)
	}
	if got := h.unlogged("other", v); len(got) != 3 {
		t.Errorf("another router: %v, want all three fields", got)
	}

	rs.ack("default/unsubscribed", 3)
	if len(rs.acked) != 0 {
		t.Errorf("ack of an unsubscribed function kept: %v", rs.acked)
	}
	for i := range maxSubscriptions {
		if !rs.subscribe("default/f" + string(rune('a'+i%26)) + strings.Repeat("x", i/26)) {
			t.Fatalf("subscription %d refused below the bound", i)
		}
	}
	if rs.subscribe("default/one-more") {
		t.Error("subscription past maxSubscriptions accepted")
	}
	if !rs.subscribe("default/fa") {
		t.Error("an existing subscription refused at the bound")
	}
	rs.queue("default/another", upd("another", 1), true)
	if rs.subscribed("default/another") || len(rs.subs) != maxSubscriptions {
		t.Errorf("a forced queue subscribed past the bound: %d subscriptions", len(rs.subs))
	}
}

func sendReport(t *testing.T, s skipperv1.Controller_ConnectClient, r *skipperv1.Report) {
	t.Helper()
	if err := s.Send(&skipperv1.RouterMessage{Message: &skipperv1.RouterMessage_Report{Report: r}}); err != nil {
		t.Fatal(err)
	}
}

// TestHugeReportChangesNoScaleDecision sends, through a real gRPC server,
// a report with counts far out of bounds and a timestamp a year ahead: no
// claim, no scale decision follows, the violations are counted, and the
// future timestamp was not applied (a later incarnation of the same router
// is still heard and scales the function).
func TestHugeReportChangesNoScaleDecision(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	fn := e.fnFor("hello", "echo")
	fn.Spec.MaxInstances = 5
	fn.Spec.Scaling.TargetInFlight = 1
	e.add(poolDeploy("echo"), fn)
	for _, n := range []string{"p1", "p2", "p3"} {
		e.add(poolPod(n, "echo"))
	}
	r := startReplica(t, e, "ctl-0", nil, func(c *Config) {
		c.ScaleInterval, c.ReportInterval, c.HeartbeatTimeout = 20*time.Millisecond, 50*time.Millisecond, 2*time.Second
	})
	id := &skipperv1.RouterIdentity{Node: "node-1", Pod: "skipper-system/router-a", Incarnation: "i1"}
	s1 := connectRouterAs(t, r, id).stream
	future := timestamppb.New(time.Now().Add(365 * 24 * time.Hour))
	sendReport(t, s1, &skipperv1.Report{Sequence: 1, Time: future, Functions: []*skipperv1.FunctionReport{{
		Function: ref("default", "hello"), InFlight: math.MaxUint32, Queued: math.MaxUint32, RequestsTotal: math.MaxUint64,
		Instances: []*skipperv1.InstanceReport{{PodUid: "uid-p1", InFlight: math.MaxUint32, CpuMillicores: proto.Uint64(math.MaxUint64)}},
	}}})
	poll.Until(t, pollTimeout, pollInterval, "violations counted", func(context.Context) error {
		return metricLines(t, r,
			`skipper_controller_wire_violations_total{field="in_flight"} 1`,
			`skipper_controller_wire_violations_total{field="queued"} 1`,
			`skipper_controller_wire_violations_total{field="counters"} 1`,
			`skipper_controller_wire_violations_total{field="sent"} 1`,
			`skipper_controller_heartbeat_batches_total{node="node-1"} 1`)
	})
	// No claim follows (in ten scale intervals, on fake time:
	// TestReportOutOfBoundsChangesNothing).
	if got := e.claimedPods(); len(got) != 0 {
		t.Fatalf("a report out of bounds claimed %v", got)
	}
	_, body := httpGetBody(t, r.httpAddr, "/metrics")
	for _, want := range []string{
		`skipper_controller_scale_decisions_total{direction="up",function="default/hello",reason="inFlight"} 0`,
		`skipper_controller_wire_violations_total{field="functions"} 0`, // every field's series exists
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	// A report with nothing wrong but its clock is applied, re-stamped
	// with the receive time.
	sendReport(t, s1, &skipperv1.Report{Sequence: 2, Time: future, Functions: []*skipperv1.FunctionReport{{
		Function: ref("default", "hello"), InFlight: 1,
	}}})
	poll.Until(t, pollTimeout, 20*time.Millisecond, "one instance for one in flight", func(context.Context) error {
		if n := len(e.claimedPods()); n != 1 {
			return fmt.Errorf("%d claimed", n)
		}
		return nil
	})

	// The router restarts (same pod, new incarnation, an honest clock):
	// had the year-ahead timestamp been applied, this would look older
	// than the last report and be ignored.
	s2 := connectRouterAs(t, r, &skipperv1.RouterIdentity{Node: "node-1", Pod: "skipper-system/router-a", Incarnation: "i2"}).stream
	seq := uint64(0)
	poll.Until(t, pollTimeout, 20*time.Millisecond, "the new incarnation's load scales the function", func(context.Context) error {
		seq++
		sendReport(t, s2, &skipperv1.Report{Sequence: seq, Time: timestamppb.Now(), Functions: []*skipperv1.FunctionReport{{
			Function: ref("default", "hello"), InFlight: 2,
		}}})
		if n := len(e.claimedPods()); n < 2 {
			return fmt.Errorf("%d claimed", n)
		}
		return nil
	})
}

func TestGetInstanceRejectsOversizedFields(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	e.add(poolDeploy("echo"), e.fnFor("hello", "echo"), poolPod("p1", "echo"))
	r := startReplica(t, e, "ctl-0", nil, nil)
	_, err := r.client.GetInstance(t.Context(), &skipperv1.GetInstanceRequest{
		Function: ref("default", "hello"), UnusablePodUids: make([]string, maxUnusable+1),
	})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), fieldUnusable) {
		t.Fatalf("GetInstance with %d unusable UIDs: %v, want InvalidArgument naming %s", maxUnusable+1, err, fieldUnusable)
	}
	_, err = r.client.ReleaseInstance(t.Context(), &skipperv1.ReleaseInstanceRequest{
		Function: ref("default", "hello"), PodUid: strings.Repeat("u", 4096), Router: &skipperv1.RouterIdentity{Pod: "r"},
	})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("ReleaseInstance with an oversized UID: %v, want InvalidArgument", err)
	}
	if got := e.claimedPods(); len(got) != 0 {
		t.Errorf("rejected calls claimed %v", got)
	}
}

// TestServerLimitsMessageSize: a message above --grpc-max-recv-msg-size is
// refused with ResourceExhausted before any handler runs.
func TestServerLimitsMessageSize(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	e.add(poolDeploy("echo"), e.fnFor("hello", "echo"), poolPod("p1", "echo"))
	r := startReplica(t, e, "ctl-0", nil, func(c *Config) { c.GRPCMaxRecvMsgSize = minRecvMsgSize })
	_, err := r.client.GetInstance(t.Context(), &skipperv1.GetInstanceRequest{
		Function: ref("default", "hello"), UnusablePodUids: []string{strings.Repeat("u", minRecvMsgSize)},
	})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("GetInstance of %d bytes: %v, want ResourceExhausted", minRecvMsgSize, err)
	}
	if _, err := r.client.GetInstance(t.Context(), &skipperv1.GetInstanceRequest{Function: ref("default", "hello")}); err != nil {
		t.Fatalf("a small GetInstance after it: %v", err)
	}
}
