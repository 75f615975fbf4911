package noderouter

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"skipper.dev/skipper/bpf"
	"skipper.dev/skipper/noderouter/dataplane"
)

// metrics are the router's Prometheus series, on their own registry with
// the constant label node: the control plane's here, the data plane's in
// dp (package dataplane).
type metrics struct {
	reg *prometheus.Registry
	dp  *dataplane.Metrics

	getInstance      *prometheus.CounterVec
	getInstanceSecs  prometheus.Histogram
	heartbeats       *prometheus.CounterVec
	heartbeatEntries prometheus.Histogram
	heartbeatSend    prometheus.Histogram
	reconnects       prometheus.Counter
	releases         *prometheus.CounterVec
	bpfMode          *prometheus.GaugeVec
	// steering is read by the BPF counter collector at scrape time; nil
	// while BPF steering is not loaded.
	steering atomic.Pointer[bpf.Steering]
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
		dp:  dataplane.NewMetrics(r),
		getInstance: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "get_instance_total",
			Help: "GetInstance calls to controllers (cache misses and retries), by result.",
		}, []string{"result"}),
		getInstanceSecs: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "get_instance_seconds",
			Help:    "Duration of GetInstance calls, including cold starts.",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
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
	}
	m.releases = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "release_instance_total",
		Help: "ReleaseInstance calls giving back oneshot instances, by result (ok, error).",
	}, []string{"result"})
	m.releases.WithLabelValues(dataplane.ResultOK)
	m.releases.WithLabelValues(dataplane.ResultError)
	m.bpfMode = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "bpf_mode",
		Help: "1 for the active BPF steering mode: off (--bpf=off), connect (calls to the VIPs rewritten to this router), failed (--bpf=auto could not load; calls take the Service path).",
	}, []string{"mode"})
	m.setBPFMode(bpfModeOff)
	for _, res := range dataplane.ControllerResults {
		m.getInstance.WithLabelValues(res)
	}
	r.MustRegister(m.getInstance, m.getInstanceSecs, m.heartbeats, m.heartbeatEntries, m.heartbeatSend, m.reconnects,
		m.releases, m.bpfMode, newBPFCollector(&m.steering))
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}
