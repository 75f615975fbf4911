package scaling

import (
	"math/rand/v2"
	"testing"
	"time"
)

// FuzzDecide checks Decide's invariants over random policies, instance sets
// and histories.
func FuzzDecide(f *testing.F) {
	f.Add(uint64(1), int32(0), int32(10), int32(10), int32(100), int32(256), uint8(4), int64(7), int64(0), int64(30), false)
	f.Add(uint64(2), int32(2), int32(3), int32(1), int32(0), int32(0), uint8(0), int64(0), int64(9), int64(-1), true)
	f.Add(uint64(3), int32(0), int32(1), int32(0), int32(50), int32(0), uint8(40), int64(0), int64(0), int64(3600), true)
	f.Fuzz(func(t *testing.T, seed uint64, minI, maxI, tIn, tCPU, tMem int32, n uint8, inFlight, queued, idleFor int64, warm bool) {
		rng := rand.New(rand.NewPCG(seed, seed>>32))
		p := Policy{
			MinInstances: minI, MaxInstances: maxI,
			TargetInFlight: tIn, TargetCPUMilli: tCPU, TargetMemoryMiB: tMem,
			IdleTimeout:  time.Minute,
			MetricWindow: time.Duration(rng.IntN(30)) * time.Second,
		}
		now := t0
		instances := make([]Instance, int(n)%80)
		for i := range instances {
			in := &instances[i]
			if rng.IntN(8) != 0 {
				in.Started = now.Add(-time.Duration(rng.IntN(3600)) * time.Second)
			}
			in.Ready = rng.IntN(4) != 0
			if rng.IntN(4) != 0 {
				in.ReadyChanged = now.Add(-time.Duration(rng.IntN(3600)) * time.Second)
			}
			in.CPUMilli, in.HasCPU = rng.Int64N(4000)-10, rng.IntN(3) != 0
			in.MemoryBytes, in.HasMemory = rng.Int64N(1<<32), rng.IntN(3) != 0
		}
		var h History
		at := now.Add(-10 * time.Minute)
		for range rng.IntN(40) {
			at = at.Add(time.Duration(rng.IntN(30)) * time.Second)
			h.record(at, int32(rng.IntN(200)), DefaultStabilizationWindow)
		}
		in := Input{
			Now: now, Instances: instances, InFlight: inFlight, Queued: queued,
			LastActive: now.Add(-time.Duration(idleFor) * time.Second), History: h, WarmedUp: warm,
		}
		d := Decide(in, p)

		q := p.withDefaults()
		current := int32(len(instances))
		if d.Instances < q.MinInstances || d.Instances > q.MaxInstances {
			t.Fatalf("Instances %d outside [%d, %d] (%+v)", d.Instances, q.MinInstances, q.MaxInstances, d)
		}
		if d.Instances < d.Recommended {
			t.Fatalf("Instances %d below the recommendation %d: scale-up must apply at once", d.Instances, d.Recommended)
		}
		if !warm && d.Instances < min(current, q.MaxInstances) {
			t.Fatalf("scaled down from %d to %d during owner warm-up", current, d.Instances)
		}
		if (max(inFlight, 0) > 0 || max(queued, 0) > 0) && q.TargetInFlight > 0 && d.Instances == 0 {
			t.Fatalf("load %d+%d but zero instances", inFlight, queued)
		}
		if d.Instances == 0 && current > 0 && d.Reason != ReasonIdle {
			t.Fatalf("scaled %d to zero with reason %q", current, d.Reason)
		}
		if d.Reason == ReasonIdle && (q.MinInstances > 0 || max(inFlight, 0)+max(queued, 0) > 0) {
			t.Fatalf("idle with min %d, load %d+%d", q.MinInstances, inFlight, queued)
		}
		if d.History.Len() > historySize {
			t.Fatalf("history grew to %d", d.History.Len())
		}
	})
}

// FuzzDecidePool checks DecidePool's invariants over random pools.
func FuzzDecidePool(f *testing.F) {
	f.Add(uint64(1), int32(3), int32(40), int32(1), int32(3), int32(3), int32(0), uint8(30), int64(1000))
	f.Add(uint64(2), int32(0), int32(1), int32(0), int32(9), int32(0), int32(4), uint8(0), int64(0))
	f.Add(uint64(3), int32(-5), int32(-1), int32(-2), int32(0), int32(-1), int32(1), uint8(200), int64(-1))
	f.Fuzz(func(t *testing.T, seed uint64, minP, maxP, headroom, replicas, ready, unrecorded int32, n uint8, readyMs int64) {
		rng := rand.New(rand.NewPCG(seed, seed>>32))
		now := t0
		in := PoolInput{Now: now, Window: time.Duration(rng.IntN(60)) * time.Second, ReadyTime: time.Duration(readyMs) * time.Millisecond,
			Headroom: headroom, Min: minP, Max: maxP, Replicas: replicas, Ready: ready, Unrecorded: unrecorded,
			LastUp: now.Add(-time.Duration(rng.IntN(5000)) * time.Millisecond)}
		for range n {
			in.Claims = append(in.Claims, now.Add(-time.Duration(rng.Int64N(int64(2*time.Minute)))+time.Second))
		}
		for range rng.IntN(10) {
			in.Asked = append(in.Asked, now.Add(-time.Duration(rng.Int64N(int64(10*time.Second)))+time.Second))
		}
		for range rng.IntN(10) {
			in.Recent = append(in.Recent, PoolPoint{At: now.Add(-time.Duration(rng.Int64N(int64(time.Minute)))), Replicas: rng.Int32N(100)})
		}
		d := DecidePool(in)
		lo, hi := max(minP, 0), max(maxP, minP, 0)
		if d.Replicas < 0 {
			t.Fatalf("negative replicas %d (%+v)", d.Replicas, d)
		}
		if d.Demand < lo || d.Demand > hi {
			t.Fatalf("demand %d outside [%d, %d]", d.Demand, lo, hi)
		}
		if d.Reason == PoolReasonDemand && d.Demand > max(2*int32(d.Claims)+max(headroom, 0), lo) {
			t.Fatalf("demand %d for %d claims with headroom %d: more than 2n + headroom", d.Demand, d.Claims, headroom)
		}
		if d.Replicas < d.Demand {
			t.Fatalf("replicas %d below the demand %d: a scale-up applies at once", d.Replicas, d.Demand)
		}
		if d.Replicas > max(hi, min(max(replicas, 0), max(ready, 0)+max(unrecorded, 0))) {
			t.Fatalf("replicas %d above the maximum %d beyond the unrecorded floor (%+v)", d.Replicas, hi, in)
		}
		if unrecorded > 0 && d.Replicas < min(ready+unrecorded, replicas) {
			t.Fatalf("replicas %d below ready %d + unrecorded %d while unrecorded claims exist", d.Replicas, ready, unrecorded)
		}
	})
}
