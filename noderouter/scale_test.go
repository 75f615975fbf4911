package noderouter

import (
	"fmt"
	"log/slog"
	"runtime"
	"runtime/debug"
	"strconv"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"skipper.dev/skipper/controller/ring"
	"skipper.dev/skipper/internal/procstat"
	"skipper.dev/skipper/noderouter/route"
	pb "skipper.dev/skipper/proto/skipperv1"
)

// The router's cost beyond the request path, in-process with synthetic
// assignments (issue 14, item 4): the memory of 10,000 cached functions and
// the work of one report interval with 10,000 active ones. `make
// bench-scale` runs these benchmarks; docs/benchmarks.md holds the figures.

// scaleFunctions is the number of functions the scale benchmarks cache.
const scaleFunctions = 10000

// scaleController is the one controller the scale benchmarks report to: it
// owns every function.
const scaleController = "198.18.1.2:9090"

// Sanity bounds the scale benchmarks fail beyond. Each is far above what
// was measured (docs/benchmarks.md); crossing one means a regression.
const (
	// maxHeapPerFunction bounds the Go heap one cached function holds:
	// its entry, its 1–3 instances, its idle mark and its metric series.
	maxHeapPerFunction = 16 << 10
	// maxReportBytes is the controller's --grpc-max-recv-msg-size default
	// (gRPC's own 4 MiB): a report the router builds must fit in it, as
	// the router sends one report per controller and never splits it.
	maxReportBytes = 4 << 20
)

// scaleUpdate is function i's assignment as its owner pushes it: 1–3
// instances named, identified and addressed as on a cluster (a pool pod's
// name, a 36-character UID, ip:port, a node name), a concurrency limit,
// and a generation seeded from the clock in microseconds as the
// controller seeds them.
func scaleUpdate(i int) *pb.AssignmentUpdate {
	ins := make([]*pb.Instance, i%3+1)
	for j := range ins {
		k := 3*i + j
		ins[j] = &pb.Instance{
			Pod:     fmt.Sprintf("pool-echo-7d9f8b6c5-%05x", k),
			PodUid:  fmt.Sprintf("%08x-7c1e-4b5a-9f3d-%012x", k, k),
			Address: fmt.Sprintf("198.%d.%d.%d:8080", 18+k>>16, k>>8&255, k&255),
			Node:    "node-" + strconv.Itoa(k%50),
		}
	}
	return &pb.AssignmentUpdate{
		Function:   &pb.FunctionRef{Namespace: fmt.Sprintf("team-%02d", i%20), Name: fmt.Sprintf("fn-%05d", i)},
		Generation: 1_764_000_000_000_000 + uint64(i),
		Instances:  ins,
		Config:     &pb.FunctionConfig{ConcurrencyLimit: 8},
	}
}

// scaleInstances is the number of instances of the first n scaleUpdates.
func scaleInstances(n int) int {
	sum := 0
	for i := range n {
		sum += i%3 + 1
	}
	return sum
}

// newScaleControlPlane is a router's control plane with no connection: a
// ring of the one controller scaleController, an empty cache, no cgroup
// reader. The caller closes it.
func newScaleControlPlane(tb testing.TB) *controlPlane {
	tb.Helper()
	cfg := DefaultConfig()
	cfg.NodeName, cfg.PodName = "node-0", "skipper-noderouter-x7k2p"
	id := &pb.RouterIdentity{Node: cfg.NodeName, Pod: cfg.PodName, Incarnation: "1f3a9c", ProtocolVersion: pb.ProtocolVersion_PROTOCOL_VERSION_1}
	cp := newControlPlane(cfg, slog.New(slog.DiscardHandler), newMetrics(cfg.NodeName), &route.Cache{}, nil, id)
	r, err := ring.New([]string{scaleController})
	if err != nil {
		tb.Fatalf("ring of %s: %v", scaleController, err)
	}
	// Stored, not setMembers: that would dial the owner of every entry.
	cp.ring.Store(r)
	return cp
}

// fillScale applies n pushed assignments, as the stream's receiver does,
// and gives every function what serving requests leaves behind: counters
// on the entry and its instances and the function's two metric series
// (as the proxy records them). It fails if an update is not applied.
func fillScale(tb testing.TB, cp *controlPlane, n int) {
	tb.Helper()
	for i := range n {
		u := scaleUpdate(i)
		if ack := cp.apply(u); ack.GetGeneration() != u.GetGeneration() {
			tb.Fatalf("update %d: acked generation %d, want %d", i, ack.GetGeneration(), u.GetGeneration())
		}
	}
	for i, e := range cp.cache.Entries() {
		e.Requests.Add(uint64(1000 + 37*i))
		e.Errors.Add(uint64(i % 7))
		e.Cold.Add(1)
		e.InFlight.Add(int64(i % 4))
		for j, in := range e.Assignment().Instances {
			in.Requests.Add(uint64(300 + 11*i + j))
			in.InFlight.Add(int64((i + j) % 3))
		}
		cp.m.dp.Served(e.Key, 200, 0.004)
	}
}

// heapAndRSS returns the live Go heap and the process's resident set after
// a full collection that returns freed memory to the kernel.
func heapAndRSS(tb testing.TB) (heap, rss uint64) {
	tb.Helper()
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rss, err := procstat.Resident()
	if err != nil {
		tb.Fatal(err)
	}
	return ms.HeapAlloc, rss
}

// cpuTime is procstat.CPUTime, failing tb on an error.
func cpuTime(tb testing.TB) time.Duration {
	tb.Helper()
	d, err := procstat.CPUTime()
	if err != nil {
		tb.Fatal(err)
	}
	return d
}

// perFunction is the growth from before to after per function, 0 when it
// shrank (the resident set can, as the runtime returns pages).
func perFunction(before, after uint64, n int) float64 {
	if after < before {
		return 0
	}
	return float64(after-before) / float64(n)
}

// BenchmarkScaleRouterCache fills an empty router's cache with 10,000
// functions from pushed assignments (1–3 instances each) and reports what
// each holds: Go heap and resident set per function (entry, instances, idle
// mark, metric series), measured after a full collection. The time per op
// is the fill: the cache is copy-on-write, so each new function copies the
// map of those before it.
func BenchmarkScaleRouterCache(b *testing.B) {
	var heap, rss float64
	for b.Loop() {
		b.StopTimer()
		heap0, rss0 := heapAndRSS(b)
		b.StartTimer()
		cp := newScaleControlPlane(b)
		fillScale(b, cp, scaleFunctions)
		cp.sweep(time.Now()) // the idle marks, as the first sweep makes them
		b.StopTimer()
		heap1, rss1 := heapAndRSS(b)
		heap += perFunction(heap0, heap1, scaleFunctions)
		rss += perFunction(rss0, rss1, scaleFunctions)
		if n := len(cp.cache.Entries()); n != scaleFunctions {
			b.Fatalf("cache holds %d functions, want %d", n, scaleFunctions)
		}
		cp.close()
		b.StartTimer()
	}
	heap /= float64(b.N)
	rss /= float64(b.N)
	b.ReportMetric(heap, "heap-B/function")
	b.ReportMetric(rss, "rss-B/function")
	if heap > maxHeapPerFunction {
		b.Fatalf("%.0f bytes of heap per cached function, want at most %d", heap, maxHeapPerFunction)
	}
}

// BenchmarkScaleRouterReport is one report interval of a router with
// 10,000 active functions, all owned by one controller: the idle sweep and
// the report as the stream loop builds it (controlPlane.report), marshalled
// as gRPC marshals the RouterMessage it is sent in. It reports the encoded
// size and the CPU time per interval (every thread, the collector's share
// included).
func BenchmarkScaleRouterReport(b *testing.B) {
	cp := newScaleControlPlane(b)
	b.Cleanup(cp.close)
	fillScale(b, cp, scaleFunctions)
	var size, functions, instances int
	var seq uint64
	b.ReportAllocs()
	cpu0 := cpuTime(b)
	for b.Loop() {
		now := time.Now()
		cp.sweep(now)
		seq++
		rep, last := cp.report(scaleController, seq, now)
		msg := &pb.RouterMessage{Message: &pb.RouterMessage_Report{Report: rep}}
		wire, err := proto.Marshal(msg)
		if err != nil {
			b.Fatalf("marshal report %d: %v", seq, err)
		}
		if len(last) != 0 {
			b.Fatalf("%d functions reported a last time, want none", len(last))
		}
		size, functions, instances = len(wire), len(rep.Functions), 0
		for _, fr := range rep.Functions {
			instances += len(fr.Instances)
		}
	}
	cpu := cpuTime(b) - cpu0
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/interval")
	b.ReportMetric(float64(size), "report-B")
	b.ReportMetric(float64(size)/float64(functions), "report-B/function")
	if want := scaleInstances(scaleFunctions); functions != scaleFunctions || instances != want {
		b.Fatalf("report covers %d functions and %d instances, want %d and %d", functions, instances, scaleFunctions, want)
	}
	if size > maxReportBytes {
		b.Fatalf("report of %d functions is %d bytes, over the controller's %d-byte receive limit", functions, size, maxReportBytes)
	}
}

// BenchmarkScaleRouterNewFunction is the cost of caching one more function
// (a pushed assignment; a cold miss stores the same way) on a router that
// caches 10,000: the copy-on-write cache copies its map per new function.
func BenchmarkScaleRouterNewFunction(b *testing.B) {
	cp := newScaleControlPlane(b)
	b.Cleanup(cp.close)
	fillScale(b, cp, scaleFunctions)
	i := scaleFunctions
	b.ReportAllocs()
	for b.Loop() {
		u := scaleUpdate(i)
		if ack := cp.apply(u); ack.GetGeneration() != u.GetGeneration() {
			b.Fatalf("update %d: acked generation %d, want %d", i, ack.GetGeneration(), u.GetGeneration())
		}
		i++
	}
}

// TestScaleReport checks, at a size make unit affords, what the scale
// benchmarks rely on: every pushed function is cached and reported to its
// owner once, with its instances and the counters its requests left.
func TestScaleReport(t *testing.T) {
	t.Parallel()
	const n = 300
	cp := newScaleControlPlane(t)
	t.Cleanup(cp.close)
	fillScale(t, cp, n)
	rep, last := cp.report(scaleController, 1, time.Now())
	if len(last) != 0 {
		t.Errorf("%d functions reported a last time, want none", len(last))
	}
	if len(rep.Functions) != n {
		t.Fatalf("report covers %d functions, want %d", len(rep.Functions), n)
	}
	seen := map[string]bool{}
	instances := 0
	for _, fr := range rep.Functions {
		key := fr.GetFunction().GetNamespace() + "/" + fr.GetFunction().GetName()
		if seen[key] {
			t.Errorf("%s reported twice", key)
		}
		seen[key] = true
		if fr.GetRequestsTotal() < 1000 || fr.GetGeneration() == 0 {
			t.Errorf("%s: requests %d, generation %d; want the counters and generation fillScale set", key, fr.GetRequestsTotal(), fr.GetGeneration())
		}
		instances += len(fr.GetInstances())
	}
	if want := scaleInstances(n); instances != want {
		t.Errorf("report lists %d instances, want %d", instances, want)
	}
	if rep, _ := cp.report("198.18.1.3:9090", 1, time.Now()); len(rep.Functions) != 0 {
		t.Errorf("a controller that owns nothing is reported %d functions", len(rep.Functions))
	}
}
