package controller

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"skipper.dev/skipper/controller/scaling"
	skipperv1 "skipper.dev/skipper/proto/skipperv1"
)

// This file checks what routers send before anything of it is applied: the
// reports and subscriptions of Connect streams and the fields of
// GetInstance and ReleaseInstance. The checks are pure functions of the
// message (and the receiver's clock, passed in); a value outside its
// bound is a violation, counted in skipper_controller_wire_violations_total
// and never applied.
//
// What happens to a violation depends on what it would break:
//
//   - Lists longer than their bound (functions per report, instances per
//     function, subscriptions per Hello) are cut at the bound: the entries
//     past it are not applied.
//   - An entry whose key is not a valid name (a FunctionRef whose namespace
//     is not a DNS label ≤ 63 or whose name is not a DNS subdomain ≤ 253
//     and a label value ≤ 63; a pod UID empty or longer than maxUIDLen) is
//     dropped.
//   - A function's gauge or counter above its bound drops that function's
//     report: clamping it would still let one router demand maxInstances,
//     and a router that sends such a number sends nothing to trust.
//   - A per-instance sample above its bound (in-flight, CPU, memory) is
//     dropped as if the router had not measured it.
//   - Report.time (Sent) more than maxClockSkew ahead of the receiver's
//     clock, more than maxReportAge behind it, or missing, is replaced by
//     the receive time. Sent only orders the incarnations of one router pod;
//     a value from the future would make every later incarnation of that
//     router look older and be ignored for good, while re-stamping keeps a
//     router with a wrong clock heard (its load still counts) without
//     trusting its clock.
//   - A RouterIdentity that is not valid (pod not [namespace/]name with a
//     DNS label namespace and a DNS subdomain name, node not a DNS
//     subdomain, incarnation or mode over maxIncarnationLen) fails the call or
//     stream with InvalidArgument: it becomes a key of the hub and of the
//     scaling windows.
//   - GetInstance and ReleaseInstance are answered InvalidArgument on any
//     violation: a caller gets a clear error and nothing changes.

// Wire bounds. Each is far above what a correct router sends and low
// enough that a message at every bound costs the controller little.
const (
	// maxReportFunctions is the most functions one report covers: a router
	// reports every function it routes to that this replica owns.
	maxReportFunctions = 10000
	// maxReportInstances is the most instances one function's report
	// lists: a Function holds at most 1000 instances (the CRD's bound).
	maxReportInstances = 1000
	// maxSubscriptions is the most functions one router stream subscribes
	// to, in its Hello and in total.
	maxSubscriptions = 10000
	// maxUnusable is the most pod UIDs one GetInstance marks unusable: at
	// most a function's instances.
	maxUnusable = 1000
	// maxGauge bounds in-flight and queued requests, per function and per
	// instance, as one router reports them: 2^20, beyond the sockets one
	// node can hold.
	maxGauge = 1 << 20
	// maxCounter bounds the cumulative request counters: 2^53, the largest
	// integer a float64 (a Prometheus sample) holds exactly.
	maxCounter = 1 << 53
	// maxCPUMilli bounds one instance's CPU sample: 2^24 millicores, about
	// 16,800 cores.
	maxCPUMilli = 1 << 24
	// maxMemoryBytes bounds one instance's memory sample: 2^50 bytes (1 PiB).
	maxMemoryBytes = 1 << 50
	// maxUIDLen bounds a pod UID (Kubernetes writes 36-character UUIDs).
	maxUIDLen = 128
	// maxIncarnationLen bounds a router's incarnation and mode strings.
	maxIncarnationLen = 128
	// maxClockSkew is how far ahead of the receiver a report may be stamped.
	maxClockSkew = 5 * time.Second
	// maxReportAge is how far behind the receiver a report may be stamped.
	maxReportAge = time.Minute
)

// Fields of skipper_controller_wire_violations_total.
const (
	fieldRouter           = "router"
	fieldFunction         = "function"
	fieldFunctions        = "functions"
	fieldSubscriptions    = "subscriptions"
	fieldSent             = "sent"
	fieldInFlight         = "in_flight"
	fieldQueued           = "queued"
	fieldCounters         = "counters"
	fieldInstances        = "instances"
	fieldInstanceInFlight = "instance_in_flight"
	fieldPodUID           = "pod_uid"
	fieldCPU              = "cpu_millicores"
	fieldMemory           = "memory_bytes"
	fieldUnusable         = "unusable_pod_uids"
)

// wireFields are the field label values; their series start at zero.
var wireFields = []string{
	fieldRouter, fieldFunction, fieldFunctions, fieldSubscriptions, fieldSent,
	fieldInFlight, fieldQueued, fieldCounters, fieldInstances, fieldInstanceInFlight,
	fieldPodUID, fieldCPU, fieldMemory, fieldUnusable,
}

// violation is how often one field was broken in a message, and the first
// problem, for the log.
type violation struct {
	Count int
	First string
}

// violations are a message's violations by field; nil when there are none.
type violations map[string]violation

func (v *violations) add(field, format string, a ...any) {
	if *v == nil {
		*v = violations{}
	}
	cur := (*v)[field]
	if cur.Count == 0 {
		cur.First = fmt.Sprintf(format, a...)
	}
	cur.Count++
	(*v)[field] = cur
}

// merge adds o's counts to v.
func (v *violations) merge(o violations) {
	for f, ov := range o {
		if *v == nil {
			*v = violations{}
		}
		cur := (*v)[f]
		if cur.Count == 0 {
			cur.First = ov.First
		}
		cur.Count += ov.Count
		(*v)[f] = cur
	}
}

// String lists the first problem of each field, fields sorted.
func (v violations) String() string {
	var b strings.Builder
	for i, f := range slices.Sorted(maps.Keys(v)) {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s: %s", f, v[f].First)
	}
	return b.String()
}

// err is the caller's answer to a unary call with violations: an
// InvalidArgument naming them; nil when there are none.
func (v violations) err(call string) error {
	if len(v) == 0 {
		return nil
	}
	return withReason(ErrInvalidRequest, "%s: %s", call, v.String())
}

// wireReport is a Report after checking: every value within its bound.
type wireReport struct {
	Sequence  uint64
	Sent      time.Time
	Functions []wireFunction
}

// wireFunction is one function's checked report.
type wireFunction struct {
	Key        string // namespace/name, valid
	Generation uint64
	InFlight   int64
	Queued     int64
	Counters   scaling.Counters
	Instances  []scaling.InstanceReport
}

// checkReport checks a report received at now (see the file comment for
// what each violation does).
func checkReport(r *skipperv1.Report, now time.Time) (wireReport, violations) {
	var v violations
	out := wireReport{Sequence: r.GetSequence(), Sent: now}
	switch ts := r.GetTime(); {
	case ts == nil:
		v.add(fieldSent, "missing: re-stamped with the receive time")
	case ts.CheckValid() != nil:
		v.add(fieldSent, "%v: re-stamped with the receive time", ts.CheckValid())
	default:
		sent := ts.AsTime()
		switch {
		case sent.After(now.Add(maxClockSkew)):
			v.add(fieldSent, "%s is %s ahead of the receiver (at most %s): re-stamped with the receive time",
				sent.UTC().Format(time.RFC3339Nano), sent.Sub(now), maxClockSkew)
		case sent.Before(now.Add(-maxReportAge)):
			v.add(fieldSent, "%s is %s behind the receiver (at most %s): re-stamped with the receive time",
				sent.UTC().Format(time.RFC3339Nano), now.Sub(sent), maxReportAge)
		default:
			out.Sent = sent
		}
	}
	frs := r.GetFunctions()
	if len(frs) > maxReportFunctions {
		v.add(fieldFunctions, "%d functions in one report (at most %d): the rest not applied", len(frs), maxReportFunctions)
		frs = frs[:maxReportFunctions]
	}
	for _, fr := range frs {
		if f, ok := checkFunctionReport(fr, &v); ok {
			out.Functions = append(out.Functions, f)
		}
	}
	return out, v
}

// checkFunctionReport checks one function's report; ok is false when it
// is dropped.
func checkFunctionReport(fr *skipperv1.FunctionReport, v *violations) (wireFunction, bool) {
	key, ok := checkRef(fr.GetFunction(), v)
	if !ok {
		return wireFunction{}, false
	}
	f := wireFunction{Key: key, Generation: fr.GetGeneration(), InFlight: int64(fr.GetInFlight()), Queued: int64(fr.GetQueued())}
	dropped := false
	if f.InFlight > maxGauge {
		v.add(fieldInFlight, "function %s: in-flight %d (at most %d): report not applied", key, f.InFlight, maxGauge)
		dropped = true
	}
	if f.Queued > maxGauge {
		v.add(fieldQueued, "function %s: queued %d (at most %d): report not applied", key, f.Queued, maxGauge)
		dropped = true
	}
	for _, c := range [...]struct {
		name string
		n    uint64
	}{{"requests", fr.GetRequestsTotal()}, {"errors", fr.GetErrorsTotal()}, {"cold starts", fr.GetColdStartsTotal()}} {
		if c.n > maxCounter {
			v.add(fieldCounters, "function %s: %s total %d (at most %d): report not applied", key, c.name, c.n, uint64(maxCounter))
			dropped = true
		}
	}
	if dropped {
		return wireFunction{}, false
	}
	f.Counters = scaling.Counters{Requests: fr.GetRequestsTotal(), Errors: fr.GetErrorsTotal(), ColdStarts: fr.GetColdStartsTotal()}
	irs := fr.GetInstances()
	if len(irs) > maxReportInstances {
		v.add(fieldInstances, "function %s: %d instances (at most %d): the rest not applied", key, len(irs), maxReportInstances)
		irs = irs[:maxReportInstances]
	}
	for _, ir := range irs {
		uid := ir.GetPodUid()
		if uid == "" || len(uid) > maxUIDLen {
			v.add(fieldPodUID, "function %s: instance pod UID of %d bytes (1 to %d): not applied", key, len(uid), maxUIDLen)
			continue
		}
		in := int64(ir.GetInFlight())
		if in > maxGauge {
			v.add(fieldInstanceInFlight, "function %s: instance %s in-flight %d (at most %d): not applied", key, uid, in, maxGauge)
			continue
		}
		rep := scaling.InstanceReport{PodUID: uid, InFlight: in}
		if ir.CpuMillicores != nil {
			if cpu := ir.GetCpuMillicores(); cpu > maxCPUMilli {
				v.add(fieldCPU, "function %s: instance %s CPU %dm (at most %dm): sample not applied", key, uid, cpu, maxCPUMilli)
			} else {
				rep.CPUMilli, rep.HasCPU = int64(cpu), true
			}
		}
		if ir.MemoryBytes != nil {
			if mem := ir.GetMemoryBytes(); mem > maxMemoryBytes {
				v.add(fieldMemory, "function %s: instance %s memory %d bytes (at most %d): sample not applied", key, uid, mem, uint64(maxMemoryBytes))
			} else {
				rep.MemoryBytes, rep.HasMemory = int64(mem), true
			}
		}
		f.Instances = append(f.Instances, rep)
	}
	return f, true
}

// checkRef returns the key of a function reference that names a valid
// namespace and name.
func checkRef(ref *skipperv1.FunctionRef, v *violations) (string, bool) {
	ns, name := ref.GetNamespace(), ref.GetName()
	if len(ns) > validation.DNS1123LabelMaxLength || len(name) > validation.DNS1123SubdomainMaxLength {
		// Not quoted into logs and answers: it may be megabytes.
		v.add(fieldFunction, "namespace of %d bytes (at most %d) or name of %d bytes (at most %d): not applied",
			len(ns), validation.DNS1123LabelMaxLength, len(name), validation.DNS1123SubdomainMaxLength)
		return "", false
	}
	if err := validateRef(ns, name); err != nil {
		v.add(fieldFunction, "%s: not applied", err)
		return "", false
	}
	return ns + "/" + name, true
}

// wireSub is one checked subscription.
type wireSub struct {
	Key        string
	Generation uint64
}

// checkHello checks a stream's Hello: an invalid router identity is an
// error (the stream is refused); invalid subscriptions are dropped and
// those past maxSubscriptions are not applied.
func checkHello(h *skipperv1.Hello) ([]wireSub, violations, error) {
	var v violations
	if h.GetRouter().GetPod() == "" {
		v.add(fieldRouter, "router.pod is required")
		return nil, v, withReason(ErrNoRouter, "Hello: router.pod is required")
	}
	if checkRouter(h.GetRouter(), &v); len(v) > 0 {
		return nil, v, withReason(ErrNoRouter, "Hello: %s", v.String())
	}
	subs := h.GetSubscriptions()
	if len(subs) > maxSubscriptions {
		v.add(fieldSubscriptions, "%d subscriptions in one Hello (at most %d): the rest not applied", len(subs), maxSubscriptions)
		subs = subs[:maxSubscriptions]
	}
	out := make([]wireSub, 0, len(subs))
	for _, s := range subs {
		if key, ok := checkRef(s.GetFunction(), &v); ok {
			out = append(out, wireSub{Key: key, Generation: s.GetGeneration()})
		}
	}
	return out, v, nil
}

// checkRouter checks a router identity's fields where they are set.
func checkRouter(id *skipperv1.RouterIdentity, v *violations) {
	if pod := id.GetPod(); pod != "" {
		// A router names itself namespace/name, or name alone when it
		// does not know its namespace.
		ns, name, hasNS := strings.Cut(pod, "/")
		if !hasNS {
			ns, name = "", pod
		}
		msgs := validation.IsDNS1123Subdomain(name)
		if hasNS {
			msgs = append(msgs, validation.IsDNS1123Label(ns)...)
		}
		if len(msgs) > 0 {
			v.add(fieldRouter, "router.pod %.64q: %s", pod, strings.Join(msgs, "; "))
		}
	}
	if node := id.GetNode(); node != "" {
		if msgs := validation.IsDNS1123Subdomain(node); len(msgs) > 0 {
			v.add(fieldRouter, "router.node %.64q: %s", node, strings.Join(msgs, "; "))
		}
	}
	if n := len(id.GetIncarnation()); n > maxIncarnationLen {
		v.add(fieldRouter, "router.incarnation of %d bytes (at most %d)", n, maxIncarnationLen)
	}
	if n := len(id.GetMode()); n > maxIncarnationLen {
		v.add(fieldRouter, "router.mode of %d bytes (at most %d)", n, maxIncarnationLen)
	}
}

// checkAck checks an Ack: ok is false when its function reference is not
// valid.
func checkAck(a *skipperv1.Ack) (string, uint64, violations, bool) {
	var v violations
	key, ok := checkRef(a.GetFunction(), &v)
	return key, a.GetGeneration(), v, ok
}

// checkGetInstance checks the fields of a GetInstance request other than
// its function reference (getInstance answers that itself): the router
// identity and the unusable pod UIDs.
func checkGetInstance(req *skipperv1.GetInstanceRequest) violations {
	var v violations
	checkRouter(req.GetRouter(), &v)
	uids := req.GetUnusablePodUids()
	if len(uids) > maxUnusable {
		v.add(fieldUnusable, "%d unusable pod UIDs (at most %d)", len(uids), maxUnusable)
	}
	for _, uid := range uids[:min(len(uids), maxUnusable)] {
		if len(uid) > maxUIDLen {
			v.add(fieldPodUID, "unusable pod UID of %d bytes (at most %d)", len(uid), maxUIDLen)
		}
	}
	return v
}

// checkRelease checks the fields of a ReleaseInstance request other than
// its function reference.
func checkRelease(req *skipperv1.ReleaseInstanceRequest) violations {
	var v violations
	checkRouter(req.GetRouter(), &v)
	if n := len(req.GetPodUid()); n > maxUIDLen {
		v.add(fieldPodUID, "pod UID of %d bytes (at most %d)", n, maxUIDLen)
	}
	return v
}
