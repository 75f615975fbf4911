package controller

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"skipper.dev/skipper/controller/scaling"
)

// Results of GetInstance for skipper_controller_assignments_total.
const (
	resultExisting  = "existing"  // answered from the ready instance set
	resultClaimed   = "claimed"   // a pool pod was claimed and assigned
	resultForwarded = "forwarded" // forwarded to the owning replica
	resultExhausted = "exhausted" // the pool had no ready pod in time
	resultLimited   = "limited"   // the caller's claim rate limit refused a claim
	resultDenied    = "denied"    // the function's callers do not allow the caller
	resultError     = "error"     // anything else
)

var assignmentResults = []string{resultExisting, resultClaimed, resultForwarded, resultExhausted, resultLimited, resultDenied, resultError}

// metrics are the controller's Prometheus series, on their own registry.
// Function-labelled series are created at zero when a Function appears and
// deleted when it goes, so dashboard queries never come back empty.
type metrics struct {
	reg              *prometheus.Registry
	assignments      *prometheus.CounterVec
	assignmentTime   prometheus.Histogram
	ownedFunctions   prometheus.Gauge
	ringMembers      prometheus.Gauge
	heartbeatBatches *prometheus.CounterVec
	instances        *prometheus.GaugeVec
	poolWaiters      *prometheus.GaugeVec
	poolTarget       *prometheus.GaugeVec
	authRefusals     *prometheus.CounterVec
	routerStreams    prometheus.Gauge
	scaleDecisions   *prometheus.CounterVec
	informerLag      prometheus.Gauge
	ownershipMoves   prometheus.Counter
	wireViolations   *prometheus.CounterVec
	unrecorded       prometheus.Gauge
	recordFailures   prometheus.Counter
}

// Directions of skipper_controller_scale_decisions_total.
const (
	directionUp   = "up"
	directionDown = "down"
)

// scaleReasons are the reasons a change of desired instances can carry in
// each direction; their series start at zero.
var scaleReasons = map[string][]scaling.Reason{
	directionUp: {scaling.ReasonInFlight, scaling.ReasonCPU, scaling.ReasonMemory, scaling.ReasonMinInstances,
		scaling.ReasonActive, scaling.ReasonMaxInstances},
	directionDown: {scaling.ReasonInFlight, scaling.ReasonCPU, scaling.ReasonMemory, scaling.ReasonMinInstances,
		scaling.ReasonMaxInstances, scaling.ReasonActive, scaling.ReasonIdle, scaling.ReasonStabilized},
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		assignments: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "skipper_controller_assignments_total",
			Help: "GetInstance calls answered, by function (namespace/name) and result: existing, claimed, forwarded, exhausted, limited, error.",
		}, []string{"function", "result"}),
		assignmentTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "skipper_controller_assignment_seconds",
			Help:    "Time GetInstance took, including any claim and assign call.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}),
		ownedFunctions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "skipper_controller_owned_functions",
			Help: "Functions this replica owns on the ring.",
		}),
		ringMembers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "skipper_controller_ring_members",
			Help: "Members of the ring as this replica sees it.",
		}),
		heartbeatBatches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "skipper_controller_heartbeat_batches_total",
			Help: "Reports received from routers, by the router's node.",
		}, []string{"node"}),
		instances: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "skipper_controller_instances",
			Help: "Claimed instances of owned functions, by function and state: ready, not_ready, terminating, draining (withdrawn from routers, waiting to be deleted), claiming (a claim in flight).",
		}, []string{"function", "state"}),
		poolWaiters: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "skipper_controller_pool_waiters",
			Help: "Claims waiting for a pool pod to become Ready, by pool (namespace/name).",
		}, []string{"pool"}),
		poolTarget: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "skipper_controller_pool_target_replicas",
			Help: "The replicas the pool autoscaler last decided for an autoscaled pool this replica owns, by pool (namespace/name).",
		}, []string{"pool"}),
		authRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "skipper_controller_auth_refusals_total",
			Help: "gRPC calls refused for who the caller is, by code: Unauthenticated (no token, or one refused) or PermissionDenied (a caller not allowed, or naming another router).",
		}, []string{"code"}),
		routerStreams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "skipper_controller_router_streams",
			Help: "Open Connect streams from routers.",
		}),
		scaleDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "skipper_controller_scale_decisions_total",
			Help: "Changes of an owned function's desired instances, by function, direction (up, down) and the reason that set the new count.",
		}, []string{"function", "direction", "reason"}),
		informerLag: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "skipper_controller_informer_lag_seconds",
			Help: "How far the pod informer lags behind this replica's own writes: the age of the oldest claim it does not show yet, or, when it shows them all, how long it took to show the last one.",
		}),
		ownershipMoves: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "skipper_controller_ownership_moves_total",
			Help: "Functions this replica gained or lost on a ring change.",
		}),
		wireViolations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "skipper_controller_wire_violations_total",
			Help: "Values routers sent outside their bounds, by field; none of them was applied (see the controller's wire bounds).",
		}, []string{"field"}),
	}
	m.unrecorded = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "skipper_controller_claims_unrecorded",
		Help: "Claims whose instance accepted but whose record (label, ownerReference) has not landed on the pod yet: written in the background, retried while the API server fails.",
	})
	m.recordFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "skipper_controller_claim_record_failures_total",
		Help: "Failed attempts to write a claim's record (each is retried until it lands or the pod is gone).",
	})
	for _, f := range wireFields {
		m.wireViolations.WithLabelValues(f)
	}
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.assignments, m.assignmentTime, m.ownedFunctions, m.ringMembers,
		m.heartbeatBatches, m.instances, m.poolWaiters, m.poolTarget, m.authRefusals, m.routerStreams,
		m.scaleDecisions, m.informerLag, m.ownershipMoves, m.wireViolations,
		m.unrecorded, m.recordFailures,
	)
	return m
}

// functionAdded initialises the function's series at zero.
func (m *metrics) functionAdded(key string) {
	for _, r := range assignmentResults {
		m.assignments.WithLabelValues(key, r)
	}
	for dir, reasons := range scaleReasons {
		for _, r := range reasons {
			m.scaleDecisions.WithLabelValues(key, dir, string(r))
		}
	}
}

// functionRemoved drops every series of the function.
func (m *metrics) functionRemoved(key string) {
	m.assignments.DeletePartialMatch(prometheus.Labels{"function": key})
	m.instances.DeletePartialMatch(prometheus.Labels{"function": key})
	m.scaleDecisions.DeletePartialMatch(prometheus.Labels{"function": key})
}

// setInstances records the owned function's instance counts by state.
func (m *metrics) setInstances(key string, byState map[string]int) {
	for _, s := range instanceStates {
		m.instances.WithLabelValues(key, s).Set(float64(byState[s]))
	}
}

// countViolations adds a message's violations to their series.
func (m *metrics) countViolations(v violations) {
	for f, n := range v {
		m.wireViolations.WithLabelValues(f).Add(float64(n.Count))
	}
}
