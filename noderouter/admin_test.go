package noderouter

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/types/known/durationpb"

	"skipper.dev/skipper/internal/poll"
	"skipper.dev/skipper/noderouter/dataplane"
	"skipper.dev/skipper/noderouter/internal/routertest"
	"skipper.dev/skipper/noderouter/route"
	pb "skipper.dev/skipper/proto/skipperv1"
)

func TestAdmin(t *testing.T) {
	t.Parallel()
	fake := startFakeController(t)
	h := startRouter(t, fake, nil)
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		resp, err := h.client.Get(h.admin + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("%s = %d", path, resp.StatusCode)
		}
		if path != "/metrics" {
			continue
		}
		for _, want := range []string{
			`skipper_noderouter_get_instance_total{node="node1",result="ok"} 0`,
			`skipper_noderouter_get_instance_total{node="node1",result="resource_exhausted"} 0`,
			`skipper_noderouter_cache_lookups_total{node="node1",result="hit"} 0`,
			`skipper_noderouter_cache_lookups_total{node="node1",result="miss"} 0`,
			`skipper_noderouter_cache_lookups_total{node="node1",result="negative"} 0`,
			`skipper_noderouter_evictions_total{node="node1"} 0`,
			`skipper_noderouter_stream_reconnects_total{node="node1"} 0`,
			`skipper_noderouter_retries_total{node="node1"} 0`,
		} {
			if !strings.Contains(string(b), want) {
				t.Errorf("/metrics lacks %s", want)
			}
		}
	}
}

// TestDrain checks that cancelling run lets an in-flight request finish.
func TestDrain(t *testing.T) {
	t.Parallel()
	fake := startFakeController(t)
	fake.handle("default/echo", fixed(1, inst("uid-1", startEcho(t, "uid-1"))))
	cfg := DefaultConfig()
	cfg.NodeName, cfg.PodName = "node1", "router-x"
	cfg.ControllerAddresses = []string{fake.addr}
	cfg.DrainDelay = 100 * time.Millisecond
	data, admin := routertest.Listen(t), routertest.Listen(t)
	rt := newRouter(cfg, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rt.run(ctx, data, admin, nil) }()

	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	got := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest("GET", "http://"+data.Addr().String()+"/?sleep=300ms", nil)
		req.Header.Set(dataplane.HeaderFunction, "default/echo")
		resp, err := tr.RoundTrip(req)
		if err != nil {
			got <- -1
			return
		}
		resp.Body.Close()
		got <- resp.StatusCode
	}()
	poll.Until(t, pollTimeout, pollInterval, "the request at the instance", func(context.Context) error {
		e, _ := rt.cache.Lookup(route.Ref{Namespace: "default", Name: "echo"})
		if e == nil {
			return errors.New("no cache entry")
		}
		return poll.Unmet(e.InFlight.Load() == 1, "%d in flight", e.InFlight.Load())
	})
	cancel()
	// During the drain delay the router fails readiness but still serves.
	poll.Until(t, pollTimeout, time.Millisecond, "/readyz failing after cancel", func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+admin.Addr().String()+"/readyz", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		return poll.Unmet(resp.StatusCode == http.StatusServiceUnavailable, "/readyz: %d", resp.StatusCode)
	})
	if s := <-got; s != 200 {
		t.Errorf("in-flight request during drain: %d, want 200", s)
	}
	if err := <-done; err != nil {
		t.Errorf("run: %v", err)
	}
}

// histCount reads how many observations a histogram holds.
func histCount(o prometheus.Observer) float64 {
	var m dto.Metric
	if err := o.(prometheus.Metric).Write(&m); err != nil {
		panic(err)
	}
	return float64(m.GetHistogram().GetSampleCount())
}

// counter reads a counter's value.
func TestUpstreamFailures(t *testing.T) {
	t.Parallel()
	fake := startFakeController(t)
	fake.handle("default/echo", fixed(1, inst("uid-1", startEcho(t, "uid-1"))))
	fake.handle("default/quick", func(_ context.Context, req *pb.GetInstanceRequest) (*pb.GetInstanceResponse, error) {
		return &pb.GetInstanceResponse{Generation: 1, Instances: []*pb.Instance{inst("uid-1", startEcho(t, "uid-q"))},
			Config: &pb.FunctionConfig{Timeout: durationpb.New(50 * time.Millisecond)}}, nil
	})
	h := startRouter(t, fake, func(c *Config) { c.RequestTimeout = 300 * time.Millisecond })
	tests := []struct {
		name, method, fn, path string
		wantStatus             int
		wantReason             string
	}{
		{"instance drops a GET: retried up to --max-attempts, then 502", "GET", "default/echo", "/?fail=1", 502, dataplane.ReasonUpstreamError},
		{"instance drops a POST: not retried", "POST", "default/echo", "/?fail=1", 502, dataplane.ReasonUpstreamError},
		{"router request timeout", "GET", "default/echo", "/?sleep=2s", 504, dataplane.ReasonUpstreamTimeout},
		{"function timeout wins", "GET", "default/quick", "/?sleep=200ms", 504, dataplane.ReasonUpstreamTimeout},
		{"instance status passes through", "GET", "default/echo", "/?status=503", 503, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := h.do(t, tt.method, tt.path, map[string]string{"X-Skipper-Function": tt.fn}, "")
			if r.status != tt.wantStatus {
				t.Fatalf("status = %d, want %d (%s)", r.status, tt.wantStatus, r.body)
			}
			if tt.wantReason == "" {
				if got := decodeEcho(t, r); got.Pod.UID != "uid-1" {
					t.Errorf("answered by %q", got.Pod.UID)
				}
				return
			}
			var body routertest.ErrorBody
			if err := json.Unmarshal(r.body, &body); err != nil || body.Reason != tt.wantReason {
				t.Errorf("body %q (%v), want reason %s", r.body, err, tt.wantReason)
			}
		})
	}
	if got, want := routertest.Value(t, h.rt.m.reg, "skipper_noderouter_retries_total"), float64(DefaultConfig().MaxAttempts-1); got != want {
		t.Errorf("retries_total = %v, want %v (the dropped GET only)", got, want)
	}
	if got := routertest.Value(t, h.rt.m.reg, "skipper_noderouter_evictions_total"); got != 0 {
		t.Errorf("evictions_total = %v, want 0 (a dropped connection does not evict)", got)
	}
	if got := routertest.Value(t, h.rt.m.reg, "skipper_noderouter_requests_total", "function", "default/echo", "code", "503"); got != 1 {
		t.Errorf("requests_total{default/echo,503} = %v, want 1", got)
	}
}
