package scaling

import (
	"slices"
	"time"
)

// RouterID identifies one router process: its pod and its incarnation
// (random per process start; cumulative counters restart with it).
type RouterID struct {
	Pod, Incarnation string
}

// Counters are cumulative per router incarnation in a Report, and deltas
// when the Window returns them.
type Counters struct {
	Requests, Errors, ColdStarts uint64
}

// InstanceReport is one instance's load as one router sees it.
type InstanceReport struct {
	PodUID   string
	InFlight int64
	// CPUMilli and MemoryBytes come from the pod's cgroup when the pod runs
	// on the router's node; valid only if HasCPU / HasMemory.
	CPUMilli    int64
	HasCPU      bool
	MemoryBytes int64
	HasMemory   bool
}

// Report is one router's report for one function, taken from a heartbeat
// batch (proto skipper.v1.FunctionReport with its Report's sequence and
// time).
type Report struct {
	Router RouterID
	// Sequence increases by one per report within an incarnation.
	Sequence uint64
	// Sent is the router's clock when it sent the report; it orders
	// incarnations of the same router pod (same node, same clock).
	Sent time.Time
	// InFlight and Queued are gauges.
	InFlight, Queued int64
	// Counters are cumulative for the incarnation.
	Counters  Counters
	Instances []InstanceReport
}

// Load is the function's aggregate across the routers heard from within the
// heartbeat timeout.
type Load struct {
	InFlight, Queued int64
	// Routers is how many routers contributed.
	Routers int
}

// Window merges the routers' reports for one function. Gauges are
// latest-wins per router; cumulative counters become deltas per router
// incarnation, so a lost report's counts arrive with the next one and a
// repeated or reordered one is dropped; a router not heard from for the
// heartbeat timeout counts as zero.
//
// The first report of an incarnation the Window has not seen sets its
// baseline and yields no delta: its counts may predate this owner (a
// previous owner saw them) or this Window (it was just created), and the
// GetInstance that started that traffic already marked the function active
// (see Touch). A Window is not safe for concurrent use.
type Window struct {
	created    time.Time
	lastActive time.Time
	totals     Counters
	routers    map[string]*routerState // by pod
}

type routerState struct {
	incarnation      string
	seq              uint64
	sent, seen       time.Time
	inFlight, queued int64
	counters         Counters
	instances        map[string]InstanceReport // by pod UID
}

// NewWindow returns an empty Window for a function this owner starts
// watching at now.
func NewWindow(now time.Time) *Window {
	return &Window{created: now, routers: map[string]*routerState{}}
}

// Observe merges r, received at now. It returns the counter increments r
// adds and whether r was taken (false for a repeated, older or superseded
// report, which changes nothing).
func (w *Window) Observe(now time.Time, r Report) (Counters, bool) {
	st := w.routers[r.Router.Pod]
	var delta Counters
	switch {
	case st == nil || st.incarnation != r.Router.Incarnation:
		if st != nil && !r.Sent.After(st.sent) {
			return Counters{}, false // a late report of an older incarnation
		}
		st = &routerState{incarnation: r.Router.Incarnation}
		w.routers[r.Router.Pod] = st
	case r.Sequence <= st.seq:
		return Counters{}, false // repeated or reordered
	default:
		delta = Counters{
			Requests:   increase(st.counters.Requests, r.Counters.Requests),
			Errors:     increase(st.counters.Errors, r.Counters.Errors),
			ColdStarts: increase(st.counters.ColdStarts, r.Counters.ColdStarts),
		}
	}
	st.seq, st.sent, st.seen = r.Sequence, r.Sent, now
	st.inFlight, st.queued = max(r.InFlight, 0), max(r.Queued, 0)
	st.counters = r.Counters
	clear(st.instances)
	for _, ir := range r.Instances {
		if st.instances == nil {
			st.instances = make(map[string]InstanceReport, len(r.Instances))
		}
		st.instances[ir.PodUID] = ir
	}
	w.totals.Requests += delta.Requests
	w.totals.Errors += delta.Errors
	w.totals.ColdStarts += delta.ColdStarts
	if st.inFlight > 0 || st.queued > 0 || delta.Requests > 0 {
		w.Touch(now)
	}
	return delta, true
}

// increase is the growth of a cumulative counter; a counter that went down
// within one incarnation (a router bug) restarts from zero, as Prometheus
// reads a reset.
func increase(prev, cur uint64) uint64 {
	if cur < prev {
		return cur
	}
	return cur - prev
}

// Touch marks the function active at now (a GetInstance, a claim).
func (w *Window) Touch(now time.Time) {
	if now.After(w.lastActive) {
		w.lastActive = now
	}
}

// LastActive is the last time a report showed load or completed requests,
// or Touch was called; zero if never.
func (w *Window) LastActive() time.Time { return w.lastActive }

// Totals are the counter increments observed since the Window was created.
func (w *Window) Totals() Counters { return w.totals }

// WarmedUp reports whether the Window has existed for one full heartbeat
// window, so every live router has reported at least once: before that an
// owner must not scale down.
func (w *Window) WarmedUp(now time.Time, heartbeatWindow time.Duration) bool {
	return now.Sub(w.created) >= heartbeatWindow
}

func live(st *routerState, now time.Time, timeout time.Duration) bool {
	return now.Sub(st.seen) < timeout
}

// Load sums the gauges of the routers heard from within timeout of now.
func (w *Window) Load(now time.Time, timeout time.Duration) Load {
	var l Load
	for _, st := range w.routers {
		if !live(st, now, timeout) {
			continue
		}
		l.InFlight += st.inFlight
		l.Queued += st.queued
		l.Routers++
	}
	return l
}

// Fill sets inst's in-flight (summed over live routers) and its CPU and
// memory samples (from the most recently heard live router that has them,
// the larger on a tie; left missing if none has) from the reports about the pod with uid.
func (w *Window) Fill(now time.Time, timeout time.Duration, uid string, inst *Instance) {
	inst.InFlight = 0
	inst.CPUMilli, inst.HasCPU, inst.MemoryBytes, inst.HasMemory = 0, false, 0, false
	var cpuSeen, memSeen time.Time
	for _, st := range w.routers {
		if !live(st, now, timeout) {
			continue
		}
		ir, ok := st.instances[uid]
		if !ok {
			continue
		}
		inst.InFlight += max(ir.InFlight, 0)
		if ir.HasCPU && newer(inst.HasCPU, st.seen, cpuSeen, ir.CPUMilli, inst.CPUMilli) {
			inst.CPUMilli, inst.HasCPU, cpuSeen = ir.CPUMilli, true, st.seen
		}
		if ir.HasMemory && newer(inst.HasMemory, st.seen, memSeen, ir.MemoryBytes, inst.MemoryBytes) {
			inst.MemoryBytes, inst.HasMemory, memSeen = ir.MemoryBytes, true, st.seen
		}
	}
}

// newer reports whether a sample heard at seen with value v replaces the one
// held (heard at heldSeen with value held): the later wins, the larger on a
// tie, so the result never depends on map order.
func newer(has bool, seen, heldSeen time.Time, v, held int64) bool {
	return !has || seen.After(heldSeen) || (seen.Equal(heldSeen) && v > held)
}

// Reported appends to dst the pod UIDs of the instances routers heard from
// within timeout of now report, sorted, each once.
func (w *Window) Reported(now time.Time, timeout time.Duration, dst []string) []string {
	start := len(dst)
	for _, st := range w.routers {
		if !live(st, now, timeout) {
			continue
		}
		for uid := range st.instances {
			dst = append(dst, uid)
		}
	}
	slices.Sort(dst[start:])
	return append(dst[:start], slices.Compact(dst[start:])...)
}

// Prune forgets routers not heard from within timeout of now (they already
// count as zero). A pruned router that reports again starts from a new
// baseline, so counts from its silence are lost, never doubled.
func (w *Window) Prune(now time.Time, timeout time.Duration) {
	for pod, st := range w.routers {
		if !live(st, now, timeout) {
			delete(w.routers, pod)
		}
	}
}

// Routers reports how many routers the Window remembers.
func (w *Window) Routers() int { return len(w.routers) }
