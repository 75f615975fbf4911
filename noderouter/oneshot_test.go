package noderouter

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"skipper.dev/skipper/internal/poll"
	"skipper.dev/skipper/noderouter/dataplane"
	"skipper.dev/skipper/noderouter/internal/routertest"
	"skipper.dev/skipper/noderouter/route"
	pb "skipper.dev/skipper/proto/skipperv1"
)

// oneshotPool answers GetInstance for a oneshot function with a fresh echo
// instance per call, as the controller does.
type oneshotPool struct {
	mu     sync.Mutex
	addrs  []string
	handed []string // pod UIDs in hand-out order
}

func newOneshotPool(t *testing.T, n int) *oneshotPool {
	t.Helper()
	p := &oneshotPool{}
	for i := range n {
		p.addrs = append(p.addrs, startEcho(t, fmt.Sprintf("once-%d", i)))
	}
	return p
}

func (p *oneshotPool) handle(_ context.Context, req *pb.GetInstanceRequest) (*pb.GetInstanceResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := len(p.handed)
	if i == len(p.addrs) {
		return nil, statusUnavailable("the test pool is empty")
	}
	uid := fmt.Sprintf("once-%d", i)
	p.handed = append(p.handed, uid)
	return &pb.GetInstanceResponse{Function: req.GetFunction(), Generation: 1,
		Config: &pb.FunctionConfig{Oneshot: true}, Instance: inst(uid, p.addrs[i]), Owner: "fake"}, nil
}

func (f *fakeController) releasedUIDs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, r := range f.releases {
		out = append(out, r.GetPodUid())
	}
	slices.Sort(out)
	return out
}

func TestOneshot(t *testing.T) {
	t.Parallel()
	fake := startFakeController(t)
	pool := newOneshotPool(t, 3)
	fake.handle("default/once", pool.handle)
	h := startRouter(t, fake, nil)

	var served []string
	for range 3 {
		r := h.call(t, "default/once")
		if r.status != 200 {
			t.Fatalf("status %d %s", r.status, r.body)
		}
		served = append(served, decodeEcho(t, r).Pod.UID)
	}
	if diff := cmp.Diff([]string{"once-0", "once-1", "once-2"}, served); diff != "" {
		t.Errorf("instances that served (-want +got): each request needs a fresh one\n%s", diff)
	}
	if got := len(fake.getCalls()); got != 3 {
		t.Errorf("GetInstance calls = %d, want 3 (one per request by design)", got)
	}
	// The release follows the response, so it may arrive just after it.
	poll.Until(t, pollTimeout, pollInterval, "three releases", fake.holds(func(f *fakeController) error {
		return poll.Unmet(len(f.releases) == 3, "%d releases", len(f.releases))
	}))
	if diff := cmp.Diff([]string{"once-0", "once-1", "once-2"}, fake.releasedUIDs()); diff != "" {
		t.Errorf("released (-want +got):\n%s", diff)
	}
	fake.mu.Lock()
	rel := fake.releases[0]
	fake.mu.Unlock()
	if rel.GetFunction().GetName() != "once" || rel.GetRouter().GetPod() != "skipper-system/router-x" {
		t.Errorf("release request = %v", rel)
	}
	// Counted when the controller's answer is back, after it saw the
	// release.
	poll.Until(t, pollTimeout, pollInterval, "release_instance_total{ok} = 3", func(context.Context) error {
		got := routertest.Counter(h.rt.m.releases.WithLabelValues(dataplane.ResultOK))
		return poll.Unmet(got == 3, "release_instance_total{ok} = %v", got)
	})
}

// TestOneshotConcurrentColdMisses: concurrent first requests share the
// first GetInstance, but each is served by an instance of its own.
func TestOneshotConcurrentColdMisses(t *testing.T) {
	t.Parallel()
	fake := startFakeController(t)
	pool := newOneshotPool(t, 6)
	release := make(chan struct{})
	var once sync.Once
	fake.handle("default/once", func(ctx context.Context, req *pb.GetInstanceRequest) (*pb.GetInstanceResponse, error) {
		once.Do(func() { <-release }) // hold the first call until all have asked
		return pool.handle(ctx, req)
	})
	h := startRouter(t, fake, nil)
	const n = 4
	var wg sync.WaitGroup
	uids := make(chan string, n)
	for range n {
		wg.Go(func() {
			r := h.call(t, "default/once")
			if r.status != 200 {
				t.Errorf("status %d %s", r.status, r.body)
				return
			}
			uids <- decodeEcho(t, r).Pod.UID
		})
	}
	poll.Until(t, pollTimeout, pollInterval, "the first GetInstance", fake.holds(func(f *fakeController) error { return poll.Unmet(len(f.calls) > 0, "%d calls", len(f.calls)) }))
	close(release)
	wg.Wait()
	close(uids)
	seen := map[string]bool{}
	for u := range uids {
		if seen[u] {
			t.Errorf("instance %s served two requests", u)
		}
		seen[u] = true
	}
	poll.Until(t, pollTimeout, pollInterval, "every handed instance released", fake.holds(func(f *fakeController) error {
		return poll.Unmet(len(f.releases) == len(f.calls), "%d releases", len(f.releases))
	}))
	if got, calls := len(fake.getCalls()), len(seen); got != calls {
		t.Errorf("GetInstance calls = %d for %d requests served", got, calls)
	}
}

// TestOneshotReleasedOnCancel: a caller that goes away mid-request still
// releases its instance.
func TestOneshotReleasedOnCancel(t *testing.T) {
	t.Parallel()
	fake := startFakeController(t)
	pool := newOneshotPool(t, 1)
	fake.handle("default/once", pool.handle)
	h := startRouter(t, fake, nil)

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "GET", h.url+"/?sleep=10s", nil)
		req.Header.Set(dataplane.HeaderFunction, "default/once")
		resp, err := h.client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	poll.Until(t, pollTimeout, pollInterval, "the request at the instance", func(context.Context) error {
		e, _ := h.rt.cache.Lookup(route.Ref{Namespace: "default", Name: "once"})
		if e == nil {
			return errors.New("no cache entry")
		}
		return poll.Unmet(e.InFlight.Load() == 1, "%d in flight", e.InFlight.Load())
	})
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the cancelled request succeeded")
	}
	poll.Until(t, pollTimeout, pollInterval, "the release after the cancel", fake.holds(func(f *fakeController) error {
		return poll.Unmet(len(f.releases) == 1, "%d releases", len(f.releases))
	}))
	if diff := cmp.Diff([]string{"once-0"}, fake.releasedUIDs()); diff != "" {
		t.Errorf("released (-want +got):\n%s", diff)
	}
}
