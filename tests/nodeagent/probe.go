package nodeagent

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// prober runs one container's readiness or liveness probe.
type prober struct {
	probe *corev1.Probe
	// liveness: the container starts alive, and the first failure past the
	// threshold is reported once (the container is then restarted).
	liveness bool
	podIP    string
	ports    []corev1.ContainerPort
	// Until the first success the probe runs eagerly: first after
	// eagerFirst, then at doubling intervals up to eagerPeriod (never above
	// the probe's period). A fresh pod becomes Ready within a few
	// milliseconds of listening rather than a whole period later (the
	// kubelet waits the period; only start-up is faster here), and a slow
	// starter costs a handful of probes.
	eagerFirst, eagerPeriod time.Duration
}

func newProber(p *corev1.Probe, podIP string, ports []corev1.ContainerPort) *prober {
	return &prober{probe: p, podIP: podIP, ports: ports, eagerFirst: 10 * time.Millisecond, eagerPeriod: 500 * time.Millisecond}
}

func newLivenessProber(p *corev1.Probe, podIP string, ports []corev1.ContainerPort) *prober {
	return &prober{probe: p, podIP: podIP, ports: ports, liveness: true}
}

// run probes until ctx ends and calls report on every change of result (a
// readiness prober starts unready, so its first report is true; a liveness
// prober reports false once and stops).
func (p *prober) run(ctx context.Context, report func(bool)) {
	pr := p.probe
	period := secondsOr(pr.PeriodSeconds, 10)
	timeout := secondsOr(pr.TimeoutSeconds, 1)
	success := int(max(pr.SuccessThreshold, 1))
	failure := int(max(pr.FailureThreshold, 1))
	if pr.FailureThreshold == 0 {
		failure = 3
	}
	wait := time.Duration(pr.InitialDelaySeconds) * time.Second
	ready := p.liveness
	succ, fail := 0, 0
	eager := p.eagerFirst
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		err := p.once(ctx, timeout)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			succ, fail = succ+1, 0
			if !ready && succ >= success {
				ready = true
				report(true)
			}
		} else {
			succ, fail = 0, fail+1
			if ready && fail >= failure {
				ready = false
				report(false)
				if p.liveness {
					return
				}
			}
		}
		wait = period
		if !ready && !p.liveness {
			wait, eager = eagerWait(period, p.eagerPeriod, eager)
		}
	}
}

// eagerWait is the wait before the next probe of a container not Ready yet,
// and the eager interval after it: eager doubles up to eagerPeriod, and
// neither ever exceeds the probe's period.
func eagerWait(period, eagerPeriod, eager time.Duration) (wait, next time.Duration) {
	wait = min(period, eagerPeriod, max(eager, time.Millisecond))
	return wait, min(2*wait, eagerPeriod)
}

func secondsOr(s int32, def int) time.Duration {
	if s <= 0 {
		return time.Duration(def) * time.Second
	}
	return time.Duration(s) * time.Second
}

// once runs the probe a single time; nil is success.
func (p *prober) once(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	h := p.probe.ProbeHandler
	switch {
	case h.HTTPGet != nil:
		port, err := p.port(h.HTTPGet.Port)
		if err != nil {
			return err
		}
		host := h.HTTPGet.Host
		if host == "" {
			host = p.podIP
		}
		scheme := "http"
		if h.HTTPGet.Scheme == corev1.URISchemeHTTPS {
			scheme = "https"
		}
		url := fmt.Sprintf("%s://%s%s", scheme, net.JoinHostPort(host, strconv.Itoa(port)), h.HTTPGet.Path)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		req.Header.Set("User-Agent", "kube-probe/skipper")
		for _, hd := range h.HTTPGet.HTTPHeaders {
			req.Header.Set(hd.Name, hd.Value)
		}
		resp, err := probeClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode >= 400 {
			return fmt.Errorf("%s: %s", url, resp.Status)
		}
		return nil
	case h.TCPSocket != nil:
		port, err := p.port(h.TCPSocket.Port)
		if err != nil {
			return err
		}
		host := h.TCPSocket.Host
		if host == "" {
			host = p.podIP
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return err
		}
		return c.Close()
	}
	// exec and gRPC probes are not supported: treat them as passing so such
	// pods still become Ready (logged once by the caller's status).
	return nil
}

func (p *prober) port(v intstr.IntOrString) (int, error) {
	if v.Type == intstr.Int {
		return v.IntValue(), nil
	}
	for _, cp := range p.ports {
		if cp.Name == v.StrVal {
			return int(cp.ContainerPort), nil
		}
	}
	if n, err := strconv.Atoi(v.StrVal); err == nil {
		return n, nil
	}
	return 0, fmt.Errorf("probe port %q: no such container port", v.StrVal)
}

// probeClient never follows redirects: a 3xx is a success, as for the kubelet.
var probeClient = &http.Client{
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	Transport:     &http.Transport{DisableKeepAlives: true, Proxy: nil},
}
