package dataplane

import (
	"net/http"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the data plane's series (skipper_noderouter_*), registered
// by NewMetrics on the router's registry.
type Metrics struct {
	requests  *prometheus.CounterVec
	cacheHit  prometheus.Counter
	cacheMiss prometheus.Counter
	// cacheNegative: a name the negative cache holds, answered 404.
	cacheNegative prometheus.Counter
	overhead      prometheus.Histogram
	upstream      prometheus.Histogram
	// functionSeconds is each function's request duration as its callers
	// see it (router and instance), by function.
	functionSeconds *prometheus.HistogramVec
	retries         prometheus.Counter
	evictions       prometheus.Counter
	// preconnects counts the pre-connections to pool pods opened or
	// renewed, by result (ok, failed).
	preconnects *prometheus.CounterVec
	queued      prometheus.Gauge
	// rejected counts requests turned away by a limit or a refusal, by reason.
	rejected *prometheus.CounterVec
	// loopServed counts the requests the event loops answered themselves;
	// handovers those they gave to the goroutine path, by reason
	// (handoverReasons), each once.
	loopServed prometheus.Counter
	handovers  map[string]prometheus.Counter

	fnMu sync.RWMutex
	fn   map[string]*fnMetrics // by function key
}

// NewMetrics makes the data plane's series and registers them on r.
func NewMetrics(r prometheus.Registerer) *Metrics {
	const ns, sub = "skipper", "noderouter"
	m := &Metrics{
		fn: make(map[string]*fnMetrics),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "requests_total",
			Help: "Requests answered, by function (namespace/name; empty when the name was missing, malformed or not in the router's cache) and HTTP status (499: the caller went away; an exchange that broke after the response's header counts as 499, 502 or 504 by its cause). The series of a deleted function are dropped.",
		}, []string{"function", "code"}),
		overhead: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "overhead_seconds",
			Help:    "The router's own time per proxied request: total minus the upstream exchange and minus GetInstance waits.",
			Buckets: []float64{.00001, .000025, .00005, .0001, .00025, .0005, .001, .0025, .005, .01, .05},
		}),
		functionSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "function_request_seconds",
			Help:    "Duration of proxied requests as callers see them (the router's work, any cold start and the instance's answer), by function.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"function"}),
		upstream: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "upstream_seconds",
			Help:    "Time from handing a request to an instance until its response body was copied.",
			Buckets: prometheus.ExponentialBuckets(.0005, 2.5, 14),
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
	m.queued = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "queued_requests",
		Help: "Requests waiting because every instance of their function is at its concurrencyLimit.",
	})
	m.preconnects = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "preconnects_total",
		Help: "Kept-alive connections to ready pool pods opened or renewed ahead of a claim (--preconnect-pool-pods), by result (ok, failed).",
	}, []string{"result"})
	m.preconnects.WithLabelValues("ok")
	m.preconnects.WithLabelValues("failed")
	m.rejected = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "rejected_total",
		Help: "Requests turned away by a limit or a refusal, by reason: router_overloaded (--max-in-flight), body_too_large (--max-body-bytes), queue_full (every instance at its concurrencyLimit and --max-queue waiting), caller_unknown and caller_denied (a function with spec.callers, called by a pod the router cannot identify or one not listed), bad_connection_header (a Connection field naming Content-Length, Transfer-Encoding, Host or an X-Skipper-* field: a 400).",
	}, []string{"reason"})
	for _, r := range rejectReasons {
		m.rejected.WithLabelValues(r)
	}
	lookups := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "cache_lookups_total",
		Help: "Assignment cache lookups, by result (hit; miss: GetInstance asked; negative: a function recently reported unknown, answered 404 without asking).",
	}, []string{"result"})
	m.cacheHit = lookups.WithLabelValues("hit")
	m.cacheMiss = lookups.WithLabelValues("miss")
	m.cacheNegative = lookups.WithLabelValues("negative")
	m.loopServed = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "loop_requests_total",
		Help: "Requests the event loops (--forwarder=loop) served from head to answer: warm bodiless GETs and HEADs whose answer has a length.",
	})
	handovers := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "loop_handovers_total",
		Help: "Caller connections the event loops gave, with the request at hand, to the goroutine path (which serves them from then on), by reason: " +
			"request (not a bodiless GET or HEAD, or a head it could not read: bodies, upgrades, h2c), cold (no cached instance: GetInstance, or oneshot), " +
			"busy (every instance at its concurrencyLimit: the request queues there), split (a head across reads), retry (the send failed before any answer), " +
			"answer (in the middle: 1xx, 101, a body not framed by a length or larger than the loop's buffer). Refusals (limits, callers) the loops answer themselves.",
	}, []string{"reason"})
	m.handovers = map[string]prometheus.Counter{}
	for _, r := range handoverReasons {
		m.handovers[r] = handovers.WithLabelValues(r)
	}
	r.MustRegister(m.requests, lookups, m.overhead, m.upstream, m.functionSeconds, m.retries, m.evictions,
		m.queued, m.preconnects, m.rejected, m.loopServed, handovers)
	return m
}

// fnMetrics are a function's series on the request path, resolved once
// (a label lookup hashes its values and may allocate).
type fnMetrics struct {
	ok      prometheus.Counter // requests{code="200"}
	seconds prometheus.Observer
	key     string
	m       *Metrics
}

// count is the requests counter of status.
func (f *fnMetrics) count(status int) prometheus.Counter {
	if status == http.StatusOK {
		return f.ok
	}
	return f.m.requests.WithLabelValues(f.key, codeLabel(status))
}

// Served counts a request of the function key answered with status,
// taking seconds as its callers saw it.
func (m *Metrics) Served(key string, status int, seconds float64) {
	fm := m.function(key)
	fm.count(status).Inc()
	fm.seconds.Observe(seconds)
}

// function returns the series of the function key, resolving them on
// first use.
func (m *Metrics) function(key string) *fnMetrics {
	m.fnMu.RLock()
	f := m.fn[key]
	m.fnMu.RUnlock()
	if f != nil {
		return f
	}
	m.fnMu.Lock()
	defer m.fnMu.Unlock()
	if f = m.fn[key]; f == nil {
		f = &fnMetrics{ok: m.requests.WithLabelValues(key, codeLabel(http.StatusOK)),
			seconds: m.functionSeconds.WithLabelValues(key), key: key, m: m}
		m.fn[key] = f
	}
	return f
}

// ForgetFunction deletes the series of the function key (namespace/name):
// it was deleted, or its cache entry left for idleness.
func (m *Metrics) ForgetFunction(key string) {
	m.fnMu.Lock()
	delete(m.fn, key)
	m.fnMu.Unlock()
	m.requests.DeletePartialMatch(prometheus.Labels{"function": key})
	m.functionSeconds.DeleteLabelValues(key)
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
