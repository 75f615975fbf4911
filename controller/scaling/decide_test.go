package scaling

import (
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

const mib = 1 << 20

// ready is an instance that has served for an hour.
func ready() Instance {
	return Instance{Ready: true, Started: t0.Add(-time.Hour), ReadyChanged: t0.Add(-time.Hour)}
}

func cpu(m int64) Instance { i := ready(); i.CPUMilli, i.HasCPU = m, true; return i }
func mem(b int64) Instance { i := ready(); i.MemoryBytes, i.HasMemory = b, true; return i }

// starting is a CPU sample from an instance claimed 10s ago, not ready yet.
func starting(m int64) Instance {
	return Instance{Started: t0.Add(-10 * time.Second), CPUMilli: m, HasCPU: true}
}

func many(n int, i Instance) []Instance {
	out := make([]Instance, n)
	for k := range out {
		out[k] = i
	}
	return out
}

func join(parts ...[]Instance) []Instance {
	var out []Instance
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

type rec struct {
	ago time.Duration
	n   int32
}

// hist records recs (oldest first) as earlier decisions would have.
func hist(recs ...rec) History {
	var h History
	for _, r := range recs {
		h.record(t0.Add(-r.ago), r.n, DefaultStabilizationWindow)
	}
	return h
}

// summary is what the table compares: the decision and each metric's
// instances (-1 when the metric gave none).
type summary struct {
	Instances, Recommended int32
	Reason                 Reason
	InFlight, CPU, Memory  int32
}

func summarize(d Decision) summary {
	n := func(r Recommendation) int32 {
		if !r.Valid {
			return -1
		}
		return r.Instances
	}
	return summary{d.Instances, d.Recommended, d.Reason, n(d.Metrics.InFlight), n(d.Metrics.CPU), n(d.Metrics.Memory)}
}

func TestDecide(t *testing.T) {
	t.Parallel()
	base := Policy{MaxInstances: 10, TargetInFlight: 10, IdleTimeout: time.Minute}
	withCPU := base
	withCPU.TargetCPUMilli = 100
	withMem := base
	withMem.TargetMemoryMiB = 256
	all := withCPU
	all.TargetMemoryMiB = 256
	active := t0.Add(-time.Second)

	tests := []struct {
		name string
		in   Input
		p    Policy
		want summary
	}{
		{
			name: "cold start: one request on zero instances gives one",
			in:   Input{InFlight: 1, LastActive: t0, WarmedUp: true},
			p:    base,
			want: summary{Instances: 1, Recommended: 1, Reason: ReasonInFlight, InFlight: 1, CPU: -1, Memory: -1},
		},
		{
			name: "cold start: queued requests alone give one, even during owner warm-up",
			in:   Input{Queued: 3, LastActive: t0},
			p:    base,
			want: summary{Instances: 1, Recommended: 1, Reason: ReasonInFlight, InFlight: 1, CPU: -1, Memory: -1},
		},
		{
			name: "in-flight plus queued over target scales up at once",
			in:   Input{Instances: many(2, ready()), InFlight: 40, Queued: 5, LastActive: active, WarmedUp: true},
			p:    base,
			want: summary{Instances: 5, Recommended: 5, Reason: ReasonInFlight, InFlight: 5, CPU: -1, Memory: -1},
		},
		{
			name: "in-flight exactly at target keeps the count",
			in:   Input{Instances: many(3, ready()), InFlight: 30, LastActive: active, WarmedUp: true},
			p:    base,
			want: summary{Instances: 3, Recommended: 3, Reason: ReasonInFlight, InFlight: 3, CPU: -1, Memory: -1},
		},
		{
			name: "in-flight has no tolerance: 10% over target adds one",
			in:   Input{Instances: many(10, ready()), InFlight: 101, LastActive: active, WarmedUp: true},
			p:    Policy{MaxInstances: 20, TargetInFlight: 10, IdleTimeout: time.Minute},
			want: summary{Instances: 11, Recommended: 11, Reason: ReasonInFlight, InFlight: 11, CPU: -1, Memory: -1},
		},
		{
			name: "zero instances and no load stays at zero",
			in:   Input{LastActive: active, WarmedUp: true},
			p:    base,
			want: summary{Instances: 0, Recommended: 0, Reason: ReasonInFlight, InFlight: 0, CPU: -1, Memory: -1},
		},
		{
			name: "idle past idleTimeout scales to zero",
			in:   Input{Instances: many(2, ready()), LastActive: t0.Add(-61 * time.Second), WarmedUp: true},
			p:    base,
			want: summary{Instances: 0, Recommended: 0, Reason: ReasonIdle, InFlight: 0, CPU: -1, Memory: -1},
		},
		{
			name: "idle exactly at idleTimeout scales to zero",
			in:   Input{Instances: many(1, ready()), LastActive: t0.Add(-time.Minute), WarmedUp: true},
			p:    base,
			want: summary{Instances: 0, Recommended: 0, Reason: ReasonIdle, InFlight: 0, CPU: -1, Memory: -1},
		},
		{
			name: "never active counts as idle",
			in:   Input{Instances: many(1, ready()), WarmedUp: true},
			p:    base,
			want: summary{Instances: 0, Recommended: 0, Reason: ReasonIdle, InFlight: 0, CPU: -1, Memory: -1},
		},
		{
			name: "idle to zero is not held by the stabilization window",
			in:   Input{Instances: many(3, ready()), LastActive: t0.Add(-2 * time.Minute), History: hist(rec{30 * time.Second, 3}), WarmedUp: true},
			p:    base,
			want: summary{Instances: 0, Recommended: 0, Reason: ReasonIdle, InFlight: 0, CPU: -1, Memory: -1},
		},
		{
			name: "not idle yet: one instance stays",
			in:   Input{Instances: many(2, ready()), LastActive: t0.Add(-59 * time.Second), WarmedUp: true},
			p:    base,
			want: summary{Instances: 1, Recommended: 1, Reason: ReasonActive, InFlight: 0, CPU: -1, Memory: -1},
		},
		{
			name: "load blocks idle even with an old lastActive",
			in:   Input{Instances: many(1, ready()), InFlight: 1, LastActive: t0.Add(-time.Hour), WarmedUp: true},
			p:    base,
			want: summary{Instances: 1, Recommended: 1, Reason: ReasonInFlight, InFlight: 1, CPU: -1, Memory: -1},
		},
		{
			name: "minInstances above zero blocks scale to zero",
			in:   Input{Instances: many(2, ready()), LastActive: t0.Add(-time.Hour), WarmedUp: true},
			p:    Policy{MinInstances: 2, MaxInstances: 10, TargetInFlight: 10, IdleTimeout: time.Minute},
			want: summary{Instances: 2, Recommended: 2, Reason: ReasonMinInstances, InFlight: 0, CPU: -1, Memory: -1},
		},
		{
			name: "minInstances raised above current scales up",
			in:   Input{Instances: many(1, ready()), InFlight: 10, LastActive: active, WarmedUp: true},
			p:    Policy{MinInstances: 3, MaxInstances: 10, TargetInFlight: 10, IdleTimeout: time.Minute},
			want: summary{Instances: 3, Recommended: 3, Reason: ReasonMinInstances, InFlight: 1, CPU: -1, Memory: -1},
		},
		{
			name: "clamped to maxInstances",
			in:   Input{Instances: many(2, ready()), InFlight: 500, LastActive: active, WarmedUp: true},
			p:    base,
			want: summary{Instances: 10, Recommended: 10, Reason: ReasonMaxInstances, InFlight: 50, CPU: -1, Memory: -1},
		},
		{
			name: "maxInstances lowered below current scales down at once despite history",
			in:   Input{Instances: many(8, ready()), InFlight: 80, LastActive: active, History: hist(rec{10 * time.Second, 8}), WarmedUp: true},
			p:    Policy{MaxInstances: 4, TargetInFlight: 10, IdleTimeout: time.Minute},
			want: summary{Instances: 4, Recommended: 4, Reason: ReasonMaxInstances, InFlight: 8, CPU: -1, Memory: -1},
		},
		{
			name: "cpu over target: ceil(n × usage/target)",
			in:   Input{Instances: many(2, cpu(200)), LastActive: active, WarmedUp: true},
			p:    withCPU,
			want: summary{Instances: 4, Recommended: 4, Reason: ReasonCPU, InFlight: 0, CPU: 4, Memory: -1},
		},
		{
			name: "cpu exactly 10% over target is within tolerance",
			in:   Input{Instances: many(4, cpu(110)), LastActive: active, WarmedUp: true},
			p:    withCPU,
			want: summary{Instances: 4, Recommended: 4, Reason: ReasonCPU, InFlight: 0, CPU: 4, Memory: -1},
		},
		{
			name: "cpu 11% over target scales up",
			in:   Input{Instances: many(4, cpu(111)), LastActive: active, WarmedUp: true},
			p:    withCPU,
			want: summary{Instances: 5, Recommended: 5, Reason: ReasonCPU, InFlight: 0, CPU: 5, Memory: -1},
		},
		{
			name: "cpu exactly 10% under target is within tolerance",
			in:   Input{Instances: many(4, cpu(90)), LastActive: active, WarmedUp: true},
			p:    withCPU,
			want: summary{Instances: 4, Recommended: 4, Reason: ReasonCPU, InFlight: 0, CPU: 4, Memory: -1},
		},
		{
			name: "cpu 11% under target scales down",
			in:   Input{Instances: many(10, cpu(89)), LastActive: active, WarmedUp: true},
			p:    withCPU,
			want: summary{Instances: 9, Recommended: 9, Reason: ReasonCPU, InFlight: 0, CPU: 9, Memory: -1},
		},
		{
			name: "custom tolerance 0.5 keeps 40% over target",
			in:   Input{Instances: many(4, cpu(140)), LastActive: active, WarmedUp: true},
			p:    Policy{MaxInstances: 10, TargetInFlight: 10, TargetCPUMilli: 100, IdleTimeout: time.Minute, Tolerance: 0.5},
			want: summary{Instances: 4, Recommended: 4, Reason: ReasonCPU, InFlight: 0, CPU: 4, Memory: -1},
		},
		{
			name: "missing cpu on scale-up counts as zero",
			in:   Input{Instances: join(many(2, cpu(300)), many(2, ready())), LastActive: active, WarmedUp: true},
			p:    withCPU,
			want: summary{Instances: 6, Recommended: 6, Reason: ReasonCPU, InFlight: 0, CPU: 6, Memory: -1},
		},
		{
			name: "missing cpu on scale-down counts as at target",
			in:   Input{Instances: join(many(2, cpu(20)), many(2, ready())), LastActive: active, WarmedUp: true},
			p:    withCPU,
			want: summary{Instances: 3, Recommended: 3, Reason: ReasonCPU, InFlight: 0, CPU: 3, Memory: -1},
		},
		{
			name: "missing cpu that would flip a scale-up into a scale-down keeps the count",
			in:   Input{Instances: join(many(2, cpu(120)), many(2, ready())), LastActive: active, WarmedUp: true},
			p:    withCPU,
			want: summary{Instances: 4, Recommended: 4, Reason: ReasonCPU, InFlight: 0, CPU: 4, Memory: -1},
		},
		{
			name: "no instance has a cpu sample: no cpu recommendation",
			in:   Input{Instances: many(3, ready()), InFlight: 25, LastActive: active, WarmedUp: true},
			p:    withCPU,
			want: summary{Instances: 3, Recommended: 3, Reason: ReasonInFlight, InFlight: 3, CPU: -1, Memory: -1},
		},
		{
			name: "not-ready instances count as zero cpu on scale-up (their start-up spike ignored)",
			in:   Input{Instances: join(many(2, cpu(300)), many(2, starting(1000))), LastActive: active, WarmedUp: true},
			p:    withCPU,
			want: summary{Instances: 6, Recommended: 6, Reason: ReasonCPU, InFlight: 0, CPU: 6, Memory: -1},
		},
		{
			name: "not-ready instances are left out of a cpu scale-down",
			in:   Input{Instances: join(many(2, cpu(50)), many(2, starting(1000))), LastActive: active, WarmedUp: true},
			p:    withCPU,
			want: summary{Instances: 1, Recommended: 1, Reason: ReasonCPU, InFlight: 0, CPU: 1, Memory: -1},
		},
		{
			name: "cpu sample taken within one metric window of readiness counts as not ready",
			in: Input{Instances: join(many(2, cpu(300)), []Instance{{
				Ready: true, Started: t0.Add(-time.Minute), ReadyChanged: t0.Add(-5 * time.Second), CPUMilli: 1000, HasCPU: true,
			}}), LastActive: active, WarmedUp: true},
			p: Policy{MaxInstances: 10, TargetInFlight: 10, TargetCPUMilli: 100, IdleTimeout: time.Minute, MetricWindow: 10 * time.Second},
			// Ratio 3 over two ready; the third counts as 0: 600/300 = 2 → 6.
			want: summary{Instances: 6, Recommended: 6, Reason: ReasonCPU, InFlight: 0, CPU: 6, Memory: -1},
		},
		{
			name: "a not-ready instance that was ready after initialization keeps its cpu sample",
			in: Input{Instances: join(many(2, cpu(300)), []Instance{{
				Started: t0.Add(-time.Hour), ReadyChanged: t0.Add(-time.Minute), CPUMilli: 300, HasCPU: true,
			}}), LastActive: active, WarmedUp: true},
			p:    withCPU,
			want: summary{Instances: 9, Recommended: 9, Reason: ReasonCPU, InFlight: 0, CPU: 9, Memory: -1},
		},
		{
			name: "memory counts not-ready instances that have samples (the unready rule is cpu's)",
			in: Input{Instances: []Instance{mem(512 * mib), {
				Started: t0.Add(-10 * time.Second), MemoryBytes: 512 * mib, HasMemory: true,
			}}, LastActive: active, WarmedUp: true},
			p:    withMem,
			want: summary{Instances: 4, Recommended: 4, Reason: ReasonMemory, InFlight: 0, CPU: -1, Memory: 4},
		},
		{
			name: "a pending claim counts as zero memory on scale-up",
			in:   Input{Instances: []Instance{mem(512 * mib), {}}, LastActive: active, WarmedUp: true},
			p:    withMem,
			want: summary{Instances: 2, Recommended: 2, Reason: ReasonMemory, InFlight: 0, CPU: -1, Memory: 2},
		},
		{
			name: "max across metrics: cpu wins",
			in:   Input{Instances: many(2, Instance{Ready: true, Started: t0.Add(-time.Hour), CPUMilli: 250, HasCPU: true, MemoryBytes: 256 * mib, HasMemory: true}), InFlight: 30, LastActive: active, WarmedUp: true},
			p:    all,
			want: summary{Instances: 5, Recommended: 5, Reason: ReasonCPU, InFlight: 3, CPU: 5, Memory: 2},
		},
		{
			name: "max across metrics: memory wins",
			in:   Input{Instances: many(2, Instance{Ready: true, Started: t0.Add(-time.Hour), CPUMilli: 100, HasCPU: true, MemoryBytes: 1024 * mib, HasMemory: true}), InFlight: 30, LastActive: active, WarmedUp: true},
			p:    all,
			want: summary{Instances: 8, Recommended: 8, Reason: ReasonMemory, InFlight: 3, CPU: 2, Memory: 8},
		},
		{
			name: "max across metrics: a tie goes to in-flight",
			in:   Input{Instances: many(2, cpu(150)), InFlight: 30, LastActive: active, WarmedUp: true},
			p:    withCPU,
			want: summary{Instances: 3, Recommended: 3, Reason: ReasonInFlight, InFlight: 3, CPU: 3, Memory: -1},
		},
		{
			name: "zero cpu and memory targets leave samples out",
			in:   Input{Instances: many(2, Instance{Ready: true, Started: t0.Add(-time.Hour), CPUMilli: 5000, HasCPU: true, MemoryBytes: 1 << 32, HasMemory: true}), InFlight: 20, LastActive: active, WarmedUp: true},
			p:    base,
			want: summary{Instances: 2, Recommended: 2, Reason: ReasonInFlight, InFlight: 2, CPU: -1, Memory: -1},
		},
		{
			name: "every target zero: no metrics, the count stays",
			in:   Input{Instances: many(3, cpu(500)), InFlight: 100, LastActive: active, WarmedUp: true},
			p:    Policy{MaxInstances: 10, IdleTimeout: time.Minute},
			want: summary{Instances: 3, Recommended: 3, Reason: ReasonNoMetrics, InFlight: -1, CPU: -1, Memory: -1},
		},
		{
			name: "stabilization holds a scale-down at the window's highest",
			in:   Input{Instances: many(5, ready()), InFlight: 20, LastActive: active, History: hist(rec{100 * time.Second, 5}), WarmedUp: true},
			p:    base,
			want: summary{Instances: 5, Recommended: 2, Reason: ReasonStabilized, InFlight: 2, CPU: -1, Memory: -1},
		},
		{
			name: "stabilization releases once the high recommendation leaves the window",
			in:   Input{Instances: many(5, ready()), InFlight: 20, LastActive: active, History: hist(rec{301 * time.Second, 5}), WarmedUp: true},
			p:    base,
			want: summary{Instances: 2, Recommended: 2, Reason: ReasonInFlight, InFlight: 2, CPU: -1, Memory: -1},
		},
		{
			name: "stabilization steps down to the highest still in the window",
			in:   Input{Instances: many(5, ready()), InFlight: 20, LastActive: active, History: hist(rec{200 * time.Second, 5}, rec{100 * time.Second, 4}), WarmedUp: true},
			p:    Policy{MaxInstances: 10, TargetInFlight: 10, IdleTimeout: time.Minute, StabilizationWindow: 150 * time.Second},
			want: summary{Instances: 4, Recommended: 2, Reason: ReasonStabilized, InFlight: 2, CPU: -1, Memory: -1},
		},
		{
			name: "a negative window turns stabilization off",
			in:   Input{Instances: many(5, ready()), InFlight: 20, LastActive: active, History: hist(rec{time.Second, 5}), WarmedUp: true},
			p:    Policy{MaxInstances: 10, TargetInFlight: 10, IdleTimeout: time.Minute, StabilizationWindow: -1},
			want: summary{Instances: 2, Recommended: 2, Reason: ReasonInFlight, InFlight: 2, CPU: -1, Memory: -1},
		},
		{
			name: "scale-up ignores the stabilization window",
			in:   Input{Instances: many(2, ready()), InFlight: 60, LastActive: active, History: hist(rec{10 * time.Second, 2}), WarmedUp: true},
			p:    base,
			want: summary{Instances: 6, Recommended: 6, Reason: ReasonInFlight, InFlight: 6, CPU: -1, Memory: -1},
		},
		{
			name: "owner warm-up blocks a scale-down",
			in:   Input{Instances: many(5, ready()), InFlight: 20, LastActive: active},
			p:    base,
			want: summary{Instances: 5, Recommended: 2, Reason: ReasonOwnerWarmup, InFlight: 2, CPU: -1, Memory: -1},
		},
		{
			name: "owner warm-up blocks an idle scale to zero",
			in:   Input{Instances: many(2, ready()), LastActive: t0.Add(-time.Hour)},
			p:    base,
			want: summary{Instances: 2, Recommended: 0, Reason: ReasonOwnerWarmup, InFlight: 0, CPU: -1, Memory: -1},
		},
		{
			name: "owner warm-up does not block a scale-up",
			in:   Input{Instances: many(2, ready()), InFlight: 80, LastActive: active},
			p:    base,
			want: summary{Instances: 8, Recommended: 8, Reason: ReasonInFlight, InFlight: 8, CPU: -1, Memory: -1},
		},
		{
			name: "owner warm-up does not block an increase of minInstances",
			in:   Input{Instances: many(1, ready()), LastActive: t0.Add(-time.Hour)},
			p:    Policy{MinInstances: 2, MaxInstances: 10, TargetInFlight: 10, IdleTimeout: time.Minute},
			want: summary{Instances: 2, Recommended: 2, Reason: ReasonMinInstances, InFlight: 0, CPU: -1, Memory: -1},
		},
		{
			name: "owner warm-up still obeys a lowered maxInstances",
			in:   Input{Instances: many(6, ready()), InFlight: 60, LastActive: active},
			p:    Policy{MaxInstances: 4, TargetInFlight: 10, IdleTimeout: time.Minute},
			want: summary{Instances: 4, Recommended: 4, Reason: ReasonMaxInstances, InFlight: 6, CPU: -1, Memory: -1},
		},
		{
			name: "negative gauges count as zero",
			in:   Input{Instances: many(2, ready()), InFlight: -50, Queued: -1, LastActive: active, WarmedUp: true},
			p:    base,
			want: summary{Instances: 1, Recommended: 1, Reason: ReasonActive, InFlight: 0, CPU: -1, Memory: -1},
		},
		{
			name: "huge load saturates instead of overflowing",
			in:   Input{Instances: many(1, ready()), InFlight: math.MaxInt64, Queued: 5, LastActive: active, WarmedUp: true},
			p:    Policy{MaxInstances: math.MaxInt32, TargetInFlight: 1, IdleTimeout: time.Minute},
			want: summary{Instances: math.MaxInt32, Recommended: math.MaxInt32, Reason: ReasonInFlight, InFlight: math.MaxInt32, CPU: -1, Memory: -1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.in.Now = t0
			got := summarize(Decide(tt.in, tt.p))
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Decide() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestDecideSequence drives Decide as a supervisor does, passing the
// returned History back, through a burst, a quiet spell held by the
// stabilization window, its release, and the idle scale to zero.
func TestDecideSequence(t *testing.T) {
	t.Parallel()
	p := Policy{MaxInstances: 10, TargetInFlight: 10, IdleTimeout: 10 * time.Minute, StabilizationWindow: time.Minute}
	type tick struct {
		at       time.Duration
		inFlight int64
		want     int32
		reason   Reason
	}
	ticks := []tick{
		{0, 1, 1, ReasonInFlight},                   // cold start, new owner: scale-up allowed
		{10 * time.Second, 75, 8, ReasonInFlight},   // burst
		{20 * time.Second, 30, 8, ReasonStabilized}, // warm-up would hold it too
		{30 * time.Second, 30, 8, ReasonStabilized}, // warmed up from here on
		{69 * time.Second, 30, 8, ReasonStabilized},
		{70 * time.Second, 30, 3, ReasonInFlight}, // the 8 left the window
		{80 * time.Second, 0, 3, ReasonStabilized},
		{141 * time.Second, 0, 1, ReasonActive},
		{70*time.Second + 10*time.Minute, 0, 0, ReasonIdle},
		{70*time.Second + 10*time.Minute + time.Second, 5, 1, ReasonInFlight}, // cold again
	}
	var h History
	var instances []Instance
	lastActive := time.Time{}
	for _, tk := range ticks {
		now := t0.Add(tk.at)
		if tk.inFlight > 0 {
			lastActive = now
		}
		d := Decide(Input{
			Now: now, Instances: instances, InFlight: tk.inFlight, LastActive: lastActive,
			History: h, WarmedUp: tk.at >= 30*time.Second,
		}, p)
		got := struct {
			N      int32
			Reason Reason
		}{d.Instances, d.Reason}
		want := struct {
			N      int32
			Reason Reason
		}{tk.want, tk.reason}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("at %v (-want +got):\n%s", tk.at, diff)
		}
		h = d.History
		instances = many(int(d.Instances), ready())
	}
}

func BenchmarkDecide(b *testing.B) {
	p := Policy{MaxInstances: 100, TargetInFlight: 10, TargetCPUMilli: 200, TargetMemoryMiB: 256, IdleTimeout: time.Minute}
	instances := join(many(40, Instance{Ready: true, Started: t0.Add(-time.Hour), CPUMilli: 150, HasCPU: true, MemoryBytes: 200 * mib, HasMemory: true}),
		many(5, ready()), many(5, starting(900)))
	in := Input{Instances: instances, InFlight: 300, Queued: 20, LastActive: t0, WarmedUp: true}
	for k := range historySize {
		in.History.record(t0.Add(time.Duration(k)*time.Second), int32(100-k), DefaultStabilizationWindow)
	}
	now := t0.Add(historySize * time.Second)
	b.ReportAllocs()
	for b.Loop() {
		in.Now = now
		d := Decide(in, p)
		in.History = d.History
		now = now.Add(time.Second)
	}
}
