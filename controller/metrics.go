package controller

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Results of GetInstance for skipper_controller_assignments_total.
const (
	resultExisting  = "existing"  // answered from the ready instance set
	resultClaimed   = "claimed"   // a pool pod was claimed and assigned
	resultForwarded = "forwarded" // forwarded to the owning replica
	resultExhausted = "exhausted" // the pool had no ready pod in time
	resultError     = "error"     // anything else
)

var assignmentResults = []string{resultExisting, resultClaimed, resultForwarded, resultExhausted, resultError}

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
	routerStreams    prometheus.Gauge
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		assignments: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "skipper_controller_assignments_total",
			Help: "GetInstance calls answered, by function (namespace/name) and result: existing, claimed, forwarded, exhausted, error.",
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
			Help: "Claimed instances of owned functions, by function and state: ready, not_ready, terminating.",
		}, []string{"function", "state"}),
		poolWaiters: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "skipper_controller_pool_waiters",
			Help: "Claims waiting for a pool pod to become Ready, by pool (namespace/name).",
		}, []string{"pool"}),
		routerStreams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "skipper_controller_router_streams",
			Help: "Open Connect streams from routers.",
		}),
	}
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.assignments, m.assignmentTime, m.ownedFunctions, m.ringMembers,
		m.heartbeatBatches, m.instances, m.poolWaiters, m.routerStreams,
	)
	return m
}

// functionAdded initialises the function's series at zero.
func (m *metrics) functionAdded(key string) {
	for _, r := range assignmentResults {
		m.assignments.WithLabelValues(key, r)
	}
}

// functionRemoved drops every series of the function.
func (m *metrics) functionRemoved(key string) {
	m.assignments.DeletePartialMatch(prometheus.Labels{"function": key})
	m.instances.DeletePartialMatch(prometheus.Labels{"function": key})
}

// setInstances records the owned function's instance counts by state.
func (m *metrics) setInstances(key string, byState map[string]int) {
	for _, s := range instanceStates {
		m.instances.WithLabelValues(key, s).Set(float64(byState[s]))
	}
}
