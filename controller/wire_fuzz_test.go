package controller

import (
	"math"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	skipperv1 "skipper.dev/skipper/proto/skipperv1"
)

// FuzzWire feeds the wire checks arbitrary messages: a Report built from
// arbitrary field values, and arbitrary bytes decoded as a Report, a Hello,
// an Ack and a GetInstanceRequest. They never panic, and what they return
// is always within the bounds wire.go states.
func FuzzWire(f *testing.F) {
	good, _ := proto.Marshal(&skipperv1.Report{Sequence: 1, Time: timestamppb.New(t0), Functions: []*skipperv1.FunctionReport{{
		Function: ref("default", "hello"), InFlight: 3,
		Instances: []*skipperv1.InstanceReport{{PodUid: "uid-1", InFlight: 1, CpuMillicores: proto.Uint64(100)}},
	}}})
	f.Add(good, int64(t0.Unix()), int32(0), "default", "hello", uint32(3), uint32(0), uint64(10), "uid-1", uint32(1), uint64(100), uint64(1<<20), uint8(1))
	f.Add([]byte{}, int64(math.MaxInt64), int32(-1), "", "Hello", uint32(math.MaxUint32), uint32(math.MaxUint32), uint64(math.MaxUint64), "", uint32(math.MaxUint32), uint64(math.MaxUint64), uint64(math.MaxUint64), uint8(255))
	f.Fuzz(func(t *testing.T, data []byte, sec int64, nanos int32, ns, name string, inFlight, queued uint32, requests uint64,
		uid string, instInFlight uint32, cpu, mem uint64, copies uint8) {
		now := t0
		// A report from the scalar values, its function repeated.
		fr := &skipperv1.FunctionReport{
			Function: ref(ns, name), InFlight: inFlight, Queued: queued,
			RequestsTotal: requests, ErrorsTotal: requests / 2, ColdStartsTotal: requests / 3,
			Instances: []*skipperv1.InstanceReport{{PodUid: uid, InFlight: instInFlight, CpuMillicores: proto.Uint64(cpu), MemoryBytes: proto.Uint64(mem)}},
		}
		r := &skipperv1.Report{Sequence: requests, Time: &timestamppb.Timestamp{Seconds: sec, Nanos: nanos}}
		for range int(copies) {
			r.Functions = append(r.Functions, fr)
		}
		checkWireReport(t, r, now)

		// The same bytes as every message a router sends.
		var fromBytes skipperv1.Report
		if proto.Unmarshal(data, &fromBytes) == nil {
			checkWireReport(t, &fromBytes, now)
		}
		var hello skipperv1.Hello
		if proto.Unmarshal(data, &hello) == nil {
			subs, v, err := checkHello(&hello)
			checkViolations(t, v)
			if err != nil && len(subs) > 0 {
				t.Errorf("checkHello refused the stream but returned %d subscriptions", len(subs))
			}
			if len(subs) > maxSubscriptions {
				t.Errorf("%d subscriptions, above %d", len(subs), maxSubscriptions)
			}
			for _, s := range subs {
				checkKey(t, s.Key)
			}
		}
		var ack skipperv1.Ack
		if proto.Unmarshal(data, &ack) == nil {
			key, _, v, ok := checkAck(&ack)
			checkViolations(t, v)
			if ok {
				checkKey(t, key)
			} else if len(v) == 0 {
				t.Error("an ack refused without a violation")
			}
		}
		var req skipperv1.GetInstanceRequest
		if proto.Unmarshal(data, &req) == nil {
			v := checkGetInstance(&req)
			checkViolations(t, v)
			if (v.err("GetInstance") == nil) != (len(v) == 0) {
				t.Error("GetInstance violations and error disagree")
			}
		}
	})
}

// checkWireReport checks checkReport's output against every bound.
func checkWireReport(t *testing.T, r *skipperv1.Report, now time.Time) {
	t.Helper()
	out, v := checkReport(r, now)
	checkViolations(t, v)
	if out.Sequence != r.GetSequence() {
		t.Errorf("sequence %d, want %d", out.Sequence, r.GetSequence())
	}
	if out.Sent.Before(now.Add(-maxReportAge)) || out.Sent.After(now.Add(maxClockSkew)) {
		t.Errorf("sent %s outside [now-%s, now+%s]", out.Sent, maxReportAge, maxClockSkew)
	}
	if len(out.Functions) > maxReportFunctions || len(out.Functions) > len(r.GetFunctions()) {
		t.Errorf("%d functions from %d, at most %d", len(out.Functions), len(r.GetFunctions()), maxReportFunctions)
	}
	for _, f := range out.Functions {
		checkKey(t, f.Key)
		if f.InFlight < 0 || f.InFlight > maxGauge || f.Queued < 0 || f.Queued > maxGauge {
			t.Errorf("%s: in-flight %d queued %d outside [0, %d]", f.Key, f.InFlight, f.Queued, maxGauge)
		}
		if c := f.Counters; c.Requests > maxCounter || c.Errors > maxCounter || c.ColdStarts > maxCounter {
			t.Errorf("%s: counters %+v above %d", f.Key, c, uint64(maxCounter))
		}
		if len(f.Instances) > maxReportInstances {
			t.Errorf("%s: %d instances, above %d", f.Key, len(f.Instances), maxReportInstances)
		}
		for _, in := range f.Instances {
			if in.PodUID == "" || len(in.PodUID) > maxUIDLen {
				t.Errorf("%s: pod UID of %d bytes", f.Key, len(in.PodUID))
			}
			if in.InFlight < 0 || in.InFlight > maxGauge {
				t.Errorf("%s: instance in-flight %d", f.Key, in.InFlight)
			}
			if in.CPUMilli < 0 || in.CPUMilli > maxCPUMilli || (!in.HasCPU && in.CPUMilli != 0) {
				t.Errorf("%s: instance CPU %d (has %v)", f.Key, in.CPUMilli, in.HasCPU)
			}
			if in.MemoryBytes < 0 || in.MemoryBytes > maxMemoryBytes || (!in.HasMemory && in.MemoryBytes != 0) {
				t.Errorf("%s: instance memory %d (has %v)", f.Key, in.MemoryBytes, in.HasMemory)
			}
		}
	}
}

func checkKey(t *testing.T, key string) {
	t.Helper()
	ns, name, _ := splitKey(key)
	if err := validateRef(ns, name); err != nil {
		t.Errorf("key %q passed the checks: %v", key, err)
	}
}

func checkViolations(t *testing.T, v violations) {
	t.Helper()
	for f, n := range v {
		if !slices.Contains(wireFields, f) || n.Count <= 0 || n.First == "" {
			t.Errorf("violation %q = %+v: not a known field with a count and a message", f, n)
		}
		if len(n.First) > 4096 {
			t.Errorf("violation %q message of %d bytes: logs must stay small", f, len(n.First))
		}
	}
}
