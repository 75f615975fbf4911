package noderouter

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Results of skipper_noderouter_get_instance_total, all initialised at 0.
const (
	resultOK                = "ok"
	resultNotFound          = "not_found"
	resultInvalidArgument   = "invalid_argument"
	resultResourceExhausted = "resource_exhausted"
	resultDeadlineExceeded  = "deadline_exceeded"
	resultUnavailable       = "unavailable"
	resultError             = "error"
)

var getInstanceResults = []string{resultOK, resultNotFound, resultInvalidArgument, resultResourceExhausted, resultDeadlineExceeded, resultUnavailable, resultError}

// metrics are the router's Prometheus series, on their own registry with
// the constant label node.
type metrics struct {
	reg *prometheus.Registry

	requests         *prometheus.CounterVec
	getInstance      *prometheus.CounterVec
	getInstanceSecs  prometheus.Histogram
	cacheHit         prometheus.Counter
	cacheMiss        prometheus.Counter
	cacheNegative    prometheus.Counter
	overhead         prometheus.Histogram
	upstream         prometheus.Histogram
	heartbeats       *prometheus.CounterVec
	heartbeatEntries prometheus.Histogram
	heartbeatSend    prometheus.Histogram
	reconnects       prometheus.Counter
	retries          prometheus.Counter
	evictions        prometheus.Counter
}

func newMetrics(node string) *metrics {
	reg := prometheus.NewRegistry()
	r := prometheus.WrapRegistererWith(prometheus.Labels{"node": node}, reg)
	const ns, sub = "skipper", "noderouter"
	m := &metrics{
		reg: reg,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "requests_total",
			Help: "Requests answered, by function (namespace/name; empty when the name was missing, malformed or unknown) and HTTP status.",
		}, []string{"function", "code"}),
		getInstance: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "get_instance_total",
			Help: "GetInstance calls to controllers (cache misses and retries), by result.",
		}, []string{"result"}),
		getInstanceSecs: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "get_instance_seconds",
			Help:    "Duration of GetInstance calls, including cold starts.",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}),
		overhead: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "overhead_seconds",
			Help:    "The router's own time per proxied request: total minus the upstream exchange and minus GetInstance waits.",
			Buckets: []float64{.00001, .000025, .00005, .0001, .00025, .0005, .001, .0025, .005, .01, .05},
		}),
		upstream: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "upstream_seconds",
			Help:    "Time from handing a request to an instance until its response body was copied.",
			Buckets: prometheus.ExponentialBuckets(.0005, 2.5, 14),
		}),
		heartbeats: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "heartbeat_batches_total",
			Help: "Reports sent, by controller address.",
		}, []string{"controller"}),
		heartbeatEntries: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "heartbeat_batch_entries",
			Help:    "Functions per report.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 8),
		}),
		heartbeatSend: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "heartbeat_send_seconds",
			Help:    "Time to build and send one report.",
			Buckets: prometheus.ExponentialBuckets(.00005, 4, 10),
		}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "stream_reconnects_total",
			Help: "Connect streams re-opened after they ended.",
		}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "retries_total",
			Help: "Requests sent again after an attempt failed before any response (a dial failure, or a broken connection of an idempotent request with no body sent).",
		}),
		evictions: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "evictions_total",
			Help: "Instances dropped from the cache after a dial failure.",
		}),
	}
	lookups := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "cache_lookups_total",
		Help: "Assignment cache lookups, by result (hit; miss: GetInstance asked; negative: a function recently reported unknown, answered 404 without asking).",
	}, []string{"result"})
	m.cacheHit = lookups.WithLabelValues("hit")
	m.cacheMiss = lookups.WithLabelValues("miss")
	m.cacheNegative = lookups.WithLabelValues("negative")
	for _, res := range getInstanceResults {
		m.getInstance.WithLabelValues(res)
	}
	r.MustRegister(m.requests, m.getInstance, m.getInstanceSecs, lookups, m.overhead, m.upstream,
		m.heartbeats, m.heartbeatEntries, m.heartbeatSend, m.reconnects, m.retries, m.evictions)
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// statusText holds the code label of every status, so labelling a request
// does not allocate.
var statusText = func() (t [600]string) {
	for i := range t {
		t[i] = strconv.Itoa(i)
	}
	return t
}()

func codeLabel(status int) string {
	if status >= 0 && status < len(statusText) {
		return statusText[status]
	}
	return strconv.Itoa(status)
}
