package scaling

import (
	"testing"
	"time"
)

func TestDecidePool(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 4, 0, 0, 0, time.UTC)
	ago := func(ds ...time.Duration) []time.Time {
		var ts []time.Time
		for _, d := range ds {
			ts = append(ts, now.Add(-d))
		}
		return ts
	}
	every := func(n int, step time.Duration) []time.Time { // n claims, the newest now
		var ts []time.Time
		for i := range n {
			ts = append(ts, now.Add(-time.Duration(i)*step))
		}
		return ts
	}
	base := PoolInput{Now: now, Window: 30 * time.Second, ReadyTime: time.Second, Headroom: 1, Min: 3, Max: 20, Replicas: 3, Ready: 3}
	with := func(f func(*PoolInput)) PoolInput { in := base; f(&in); return in }
	for _, tc := range []struct {
		name   string
		in     PoolInput
		want   int32
		reason PoolReason
		claims int
	}{
		{"no claims: the minimum", base, 3, PoolReasonMin, 0},
		// One claim reads over half the ready time: 2/s × 1 s + 1.
		{"one claim reads as two a second, not more", with(func(in *PoolInput) { in.Claims = ago(0) }), 3, PoolReasonDemand, 1},
		{"a fast start reads one claim faster", with(func(in *PoolInput) {
			in.Min, in.ReadyTime, in.Claims = 0, 400*time.Millisecond, ago(0) // over 0.2 s: 5/s × 0.4 s + 1
		}), 3, PoolReasonDemand, 1},
		// 10 claims over 0.9 s: 11.1/s × 1 s → 12, + 1.
		{"a burst at its own rate", with(func(in *PoolInput) { in.Claims = every(10, 100*time.Millisecond) }), 13, PoolReasonDemand, 10},
		// The same 10 claims, 20 s later: 10 over 20.9 s, ×1 s → 1, + 1.
		{"a burst fades as the span grows", with(func(in *PoolInput) {
			in.Claims = ago(20*time.Second, 20100*time.Millisecond, 20200*time.Millisecond, 20300*time.Millisecond, 20400*time.Millisecond,
				20500*time.Millisecond, 20600*time.Millisecond, 20700*time.Millisecond, 20800*time.Millisecond, 20900*time.Millisecond)
		}), 3, PoolReasonMin, 10},
		{"claims older than the window count for nothing", with(func(in *PoolInput) { in.Claims = ago(31*time.Second, 40*time.Second) }), 3, PoolReasonMin, 0},
		{"claims in the future (clock skew) are ignored", with(func(in *PoolInput) { in.Claims = ago(-time.Second) }), 3, PoolReasonMin, 0},
		{"a slow pod start needs more", with(func(in *PoolInput) {
			in.Claims = every(10, 100*time.Millisecond)
			in.ReadyTime = 1500 * time.Millisecond
		}), 18, PoolReasonDemand, 10},
		{"the maximum bounds it", with(func(in *PoolInput) { in.Claims = every(50, 20*time.Millisecond) }), 20, PoolReasonMax, 50},
		{"max below min is min", with(func(in *PoolInput) { in.Max = 1; in.Claims = every(50, 20*time.Millisecond) }), 3, PoolReasonMax, 50},
		{"defaults for a zero window and ready time", with(func(in *PoolInput) {
			in.Window, in.ReadyTime = 0, 0
			in.Claims = every(5, 200*time.Millisecond) // 5 over 0.8 s → 6.25/s × 1 s → 7, + 1
		}), 8, PoolReasonDemand, 5},
		{"negative headroom is none", with(func(in *PoolInput) { in.Headroom = -4; in.Min = 0; in.Claims = every(4, 250*time.Millisecond) }), 6, PoolReasonDemand, 4},
		{"a scale-down waits for unrecorded claims", with(func(in *PoolInput) { in.Replicas, in.Ready, in.Unrecorded = 12, 8, 2 }), 10, PoolReasonUnrecorded, 0},
		{"the unrecorded floor never raises above replicas", with(func(in *PoolInput) { in.Replicas, in.Ready, in.Unrecorded = 6, 8, 2 }), 6, PoolReasonUnrecorded, 0},
		{"unrecorded claims do not hold what demand exceeds", with(func(in *PoolInput) {
			in.Replicas, in.Ready, in.Unrecorded = 4, 2, 1
			in.Claims = every(10, 100*time.Millisecond)
		}), 13, PoolReasonDemand, 10},
		{"a dry pool grows by the window's claims", with(func(in *PoolInput) {
			in.Replicas, in.Ready = 5, 0
			in.Claims = ago(2*time.Second, 1500*time.Millisecond, 200*time.Millisecond) // 3 over 2 s: 2 + 1
		}), 8, PoolReasonDry, 3},
		{"a dry pool at most doubles", with(func(in *PoolInput) {
			in.Replicas, in.Ready = 4, 0
			in.Claims = every(8, 100*time.Millisecond) // 8 over 0.7 s: 12 + 1, doubled: 8
		}), 13, PoolReasonDemand, 8},
		{"a dry pool waits for the pods on their way", with(func(in *PoolInput) {
			in.Replicas, in.Ready, in.Asked = 5, 0, ago(100*time.Millisecond, 1900*time.Millisecond) // 2 on their way for 1 claim within the ready time
			in.Claims = ago(2*time.Second, 1500*time.Millisecond, 200*time.Millisecond)              // 1.5/s × 1 s → 2, + 1
		}), 3, PoolReasonDemand, 3},
		{"a dry pool grows while the pods on their way do not outnumber its claims", with(func(in *PoolInput) {
			in.Replicas, in.Ready, in.Asked = 5, 0, ago(100*time.Millisecond) // as many on their way as claims within the ready time
			in.Claims = ago(2*time.Second, 1500*time.Millisecond, 200*time.Millisecond)
		}), 8, PoolReasonDry, 3},
		{"pods late on their way hold no growth", with(func(in *PoolInput) {
			in.Replicas, in.Ready = 5, 0
			in.Asked = ago(100*time.Millisecond, 2100*time.Millisecond, 5*time.Second, -time.Second) // one within two ready times; one in the future
			in.Claims = ago(2*time.Second, 1500*time.Millisecond, 200*time.Millisecond)
		}), 8, PoolReasonDry, 3},
		{"a dry pool doubles once per ready time", with(func(in *PoolInput) {
			in.Replicas, in.Ready, in.LastUp = 5, 0, now.Add(-500*time.Millisecond)
			in.Claims = ago(2*time.Second, 1500*time.Millisecond, 200*time.Millisecond)
		}), 3, PoolReasonDemand, 3},
		{"a pool without claims of late is not dry", with(func(in *PoolInput) {
			in.Replicas, in.Ready = 5, 0
			in.Claims = ago(2*time.Second, 1500*time.Millisecond)
		}), 3, PoolReasonMin, 2},
		{"a dry pool grows within the maximum", with(func(in *PoolInput) {
			in.Replicas, in.Ready = 15, 0
			in.Claims = every(8, 100*time.Millisecond)
		}), 20, PoolReasonMax, 8},
		{"a scale-down waits for the window's higher demand", with(func(in *PoolInput) {
			in.Replicas = 11
			in.Recent = []PoolPoint{{now.Add(-40 * time.Second), 20}, {now.Add(-5 * time.Second), 9}, {now.Add(-2 * time.Second), 7}}
		}), 9, PoolReasonStabilized, 0},
		{"earlier demand never raises above replicas", with(func(in *PoolInput) {
			in.Replicas = 5
			in.Recent = []PoolPoint{{now.Add(-time.Second), 9}}
		}), 5, PoolReasonStabilized, 0},
		{"earlier demand holds no more than the maximum", with(func(in *PoolInput) {
			in.Replicas, in.Max = 40, 10
			in.Recent = []PoolPoint{{now.Add(-time.Second), 40}}
		}), 10, PoolReasonStabilized, 0},
		{"earlier demand does not hold a scale-up", with(func(in *PoolInput) {
			in.Replicas = 3
			in.Claims = every(10, 100*time.Millisecond)
			in.Recent = []PoolPoint{{now.Add(-time.Second), 14}}
		}), 13, PoolReasonDemand, 10},
		{"demand outside the window holds nothing", with(func(in *PoolInput) {
			in.Replicas = 9
			in.Recent = []PoolPoint{{now.Add(-31 * time.Second), 9}}
		}), 3, PoolReasonMin, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := DecidePool(tc.in)
			if lo, hi := max(tc.in.Min, 0), max(tc.in.Max, tc.in.Min, 0); tc.in.Unrecorded == 0 && (d.Replicas < lo || d.Replicas > hi) {
				t.Errorf("decision %d outside [%d, %d] with nothing unrecorded", d.Replicas, lo, hi)
			}
			if d.Replicas != tc.want || d.Reason != tc.reason || d.Claims != tc.claims {
				t.Errorf("DecidePool = %d %s (%d claims, %.2f/s), want %d %s (%d claims)", d.Replicas, d.Reason, d.Claims, d.Rate, tc.want, tc.reason, tc.claims)
			}
		})
	}
}
