package noderouter

import (
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"skipper.dev/skipper/bpf"
)

// Results of skipper_noderouter_get_instance_total, all initialised at 0.
const (
	resultOK                = "ok"
	resultNotFound          = "not_found"
	resultInvalidArgument   = "invalid_argument"
	resultResourceExhausted = "resource_exhausted"
	resultDeadlineExceeded  = "deadline_exceeded"
	resultUnavailable       = "unavailable"
	resultCallerRefused     = "caller_refused"
	resultError             = "error"
)

var getInstanceResults = []string{resultOK, resultNotFound, resultInvalidArgument, resultResourceExhausted, resultDeadlineExceeded, resultUnavailable, resultCallerRefused, resultError}

// metrics are the router's Prometheus series, on their own registry with
// the constant label node.
type metrics struct {
	reg *prometheus.Registry

	requests        *prometheus.CounterVec
	getInstance     *prometheus.CounterVec
	getInstanceSecs prometheus.Histogram
	cacheHit        prometheus.Counter
	cacheMiss       prometheus.Counter
	cacheNegative   prometheus.Counter
	overhead        prometheus.Histogram
	upstream        prometheus.Histogram
	// functionSeconds is each function's request duration as its callers
	// see it (router and instance), by function.
	functionSeconds  *prometheus.HistogramVec
	heartbeats       *prometheus.CounterVec
	heartbeatEntries prometheus.Histogram
	heartbeatSend    prometheus.Histogram
	reconnects       prometheus.Counter
	retries          prometheus.Counter
	evictions        prometheus.Counter
	// preconnects counts the pre-connections to pool pods opened or
	// renewed, by result (ok, failed).
	preconnects *prometheus.CounterVec
	queued      prometheus.Gauge
	releases    *prometheus.CounterVec
	// rejected counts requests turned away by a limit or a refusal, by reason.
	rejected *prometheus.CounterVec
	bpfMode  *prometheus.GaugeVec
	// loopServed counts the requests the event loops answered themselves;
	// handovers those they gave to the goroutine path, by reason
	// (handoverReasons), each once.
	loopServed prometheus.Counter
	handovers  map[string]prometheus.Counter
	// steering is read by the BPF counter collector at scrape time; nil
	// while BPF steering is not loaded.
	steering atomic.Pointer[bpf.Steering]

	fnMu sync.RWMutex
	fn   map[string]*fnMetrics // by function key
}

// Values of skipper_noderouter_bpf_mode's mode label, all initialised.
const (
	bpfModeOff     = "off"     // --bpf=off
	bpfModeConnect = "connect" // connect4/6 steering loaded and heartbeating
	bpfModeFailed  = "failed"  // --bpf=auto could not load: the Service path only
)

var bpfModes = []string{bpfModeOff, bpfModeConnect, bpfModeFailed}

// setBPFMode makes mode the one active mode.
func (m *metrics) setBPFMode(mode string) {
	for _, v := range bpfModes {
		g := 0.0
		if v == mode {
			g = 1
		}
		m.bpfMode.WithLabelValues(v).Set(g)
	}
}

// bpfCollector exports the steering programs' per-CPU counters, read from
// the maps at scrape time (no polling goroutine). The series are 0 while
// steering is not loaded, so queries never come back empty.
type bpfCollector struct {
	steering                      *atomic.Pointer[bpf.Steering]
	rewrites, failOpens, redirect *prometheus.Desc
}

var _ prometheus.Collector = (*bpfCollector)(nil)

func newBPFCollector(s *atomic.Pointer[bpf.Steering]) *bpfCollector {
	return &bpfCollector{
		steering: s,
		rewrites: prometheus.NewDesc("skipper_noderouter_bpf_rewrites_total",
			"Connects to the skipper Service VIPs rewritten in the kernel to this node's router (cumulative since the pinned maps were created; survives router restarts).", nil, nil),
		failOpens: prometheus.NewDesc("skipper_noderouter_bpf_fail_opens_total",
			"Connects to the VIPs left to kube-proxy because this router's liveness entry was stale or withdrawn (fail open).", nil, nil),
		redirect: prometheus.NewDesc("skipper_noderouter_bpf_redirects_total",
			"Messages redirected by sk_msg between steered callers' sockets and this router's (with --bpf-sk-msg; 0 without).", nil, nil),
	}
}

func (c *bpfCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.rewrites
	ch <- c.failOpens
	ch <- c.redirect
}

func (c *bpfCollector) Collect(ch chan<- prometheus.Metric) {
	var n bpf.Counters
	if s := c.steering.Load(); s != nil {
		var err error
		if n, err = s.Counters(); err != nil {
			// A map lookup failing is a bug or a closed map; leave the
			// series out of this scrape rather than report a false reset.
			return
		}
	}
	ch <- prometheus.MustNewConstMetric(c.rewrites, prometheus.CounterValue, float64(n.Rewrites))
	ch <- prometheus.MustNewConstMetric(c.failOpens, prometheus.CounterValue, float64(n.FailOpens))
	ch <- prometheus.MustNewConstMetric(c.redirect, prometheus.CounterValue, float64(n.Redirects))
}

func newMetrics(node string) *metrics {
	reg := prometheus.NewRegistry()
	r := prometheus.WrapRegistererWith(prometheus.Labels{"node": node}, reg)
	const ns, sub = "skipper", "noderouter"
	m := &metrics{
		reg: reg,
		fn:  make(map[string]*fnMetrics),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "requests_total",
			Help: "Requests answered, by function (namespace/name; empty when the name was missing, malformed or not in the router's cache) and HTTP status (499: the caller went away; an exchange that broke after the response's header counts as 499, 502 or 504 by its cause). The series of a deleted function are dropped.",
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
	m.queued = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "queued_requests",
		Help: "Requests waiting because every instance of their function is at its concurrencyLimit.",
	})
	m.releases = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "release_instance_total",
		Help: "ReleaseInstance calls giving back oneshot instances, by result (ok, error).",
	}, []string{"result"})
	m.releases.WithLabelValues(resultOK)
	m.releases.WithLabelValues(resultError)
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
	m.bpfMode = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "bpf_mode",
		Help: "1 for the active BPF steering mode: off (--bpf=off), connect (calls to the VIPs rewritten to this router), failed (--bpf=auto could not load; calls take the Service path).",
	}, []string{"mode"})
	m.setBPFMode(bpfModeOff)
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
	r.MustRegister(m.loopServed, handovers)
	r.MustRegister(m.requests, m.getInstance, m.getInstanceSecs, lookups, m.overhead, m.upstream, m.functionSeconds,
		m.heartbeats, m.heartbeatEntries, m.heartbeatSend, m.reconnects, m.retries, m.evictions,
		m.queued, m.releases, m.preconnects, m.rejected, m.bpfMode, newBPFCollector(&m.steering))
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// fnMetrics are a function's series on the request path, resolved once
// (a label lookup hashes its values and may allocate).
type fnMetrics struct {
	ok      prometheus.Counter // requests{code="200"}
	seconds prometheus.Observer
	key     string
	m       *metrics
}

// count is the requests counter of status.
func (f *fnMetrics) count(status int) prometheus.Counter {
	if status == http.StatusOK {
		return f.ok
	}
	return f.m.requests.WithLabelValues(f.key, codeLabel(status))
}

// function returns the series of the function key, resolving them on
// first use.
func (m *metrics) function(key string) *fnMetrics {
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

// forgetFunction deletes the series of the function key (namespace/name):
// it was deleted, or its cache entry left for idleness.
func (m *metrics) forgetFunction(key string) {
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
