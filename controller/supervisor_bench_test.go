package controller

import (
	"context"
	"testing"
	"time"
)

// BenchmarkConvergeTick is one supervisor tick for every one of 10,000
// owned functions on one replica (newScaleReplica: 1–3 ready instances
// each at their desired count, one router's reports in the windows): the
// steady state, where a tick reads the caches and the report window,
// decides, and writes nothing. BenchmarkScaleConverge adds the report.
func BenchmarkConvergeTick(b *testing.B) {
	const functions = 10000
	r := newScaleReplica(b, functions)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		now := time.Now()
		for _, s := range r.sups {
			if !s.tick(ctx, now) {
				b.Fatalf("%s: supervisor stopped in steady state", s.key)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/functions, "ns/function")
}
