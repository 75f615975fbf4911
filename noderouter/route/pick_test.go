package route

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"skipper.dev/skipper/internal/poll"
)

// assignment returns an assignment of instances "1".."n" with the given
// in-flight counts.
func assignment(limit uint32, loads ...int64) *Assignment {
	a := &Assignment{Generation: 1, Config: Config{ConcurrencyLimit: limit}}
	for i, l := range loads {
		in := &Instance{InstanceInfo: InstanceInfo{PodUID: string(rune('1' + i))}}
		in.InFlight.Store(l)
		a.Instances = append(a.Instances, in)
	}
	return a
}

func loads(a *Assignment) []int64 {
	var out []int64
	for _, in := range a.Instances {
		out = append(out, in.InFlight.Load())
	}
	return out
}

// draw builds the random number that makes Acquire draw candidates i and
// j of n (j as an index among the other n-1).
func draw(i, j uint64) uint64 { return j<<32 | i }

func TestAcquire(t *testing.T) {
	tests := []struct {
		name      string
		limit     uint32
		loads     []int64
		r         uint64
		except    []int // indexes
		want      string
		wantLoads []int64
	}{
		{"empty", 0, nil, 0, nil, "", nil},
		{"single", 0, []int64{4}, 7, nil, "1", []int64{5}},
		{"the less loaded of the two", 0, []int64{2, 1, 1}, draw(0, 0), nil, "2", []int64{2, 2, 1}},
		{"a tie goes to the first drawn", 0, []int64{2, 1, 1}, draw(2, 1), nil, "3", []int64{2, 1, 2}},
		{"never the third", 0, []int64{5, 5, 0}, draw(0, 0), nil, "1", []int64{6, 5, 0}},
		{"below the limit", 2, []int64{2, 1, 1}, draw(0, 0), nil, "2", []int64{2, 2, 1}},
		{"both drawn full: the least loaded with room", 3, []int64{3, 3, 1, 0}, draw(0, 0), nil, "4", []int64{3, 3, 1, 1}},
		{"all full", 1, []int64{2, 1, 1}, draw(0, 0), nil, "", []int64{2, 1, 1}},
		{"single full", 1, []int64{1}, 0, nil, "", []int64{1}},
		{"excluded candidate", 0, []int64{0, 1, 9}, draw(0, 0), []int{0}, "2", []int64{0, 2, 9}},
		{"both candidates excluded", 0, []int64{0, 1, 9}, draw(0, 0), []int{0, 1}, "3", []int64{0, 1, 10}},
		{"everything excluded", 0, []int64{0, 1}, 0, []int{0, 1}, "", []int64{0, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := assignment(tt.limit, tt.loads...)
			var except []*Instance
			for _, i := range tt.except {
				except = append(except, a.Instances[i])
			}
			got := ""
			if in := a.Acquire(tt.r, tt.limit, except); in != nil {
				got = in.PodUID
			}
			if got != tt.want {
				t.Errorf("Acquire = %q, want %q", got, tt.want)
			}
			if diff := cmp.Diff(tt.wantLoads, loads(a)); diff != "" {
				t.Errorf("in-flight afterwards (-want +got):\n%s", diff)
			}
		})
	}
}

// TestAcquireTwoChoices checks the property that makes the power of two
// choices work: the most loaded instance is never taken while another has
// fewer requests, and every other instance is drawn.
func TestAcquireTwoChoices(t *testing.T) {
	a := assignment(0, 9, 0, 0, 0)
	seen := map[string]int{}
	for range 1000 {
		in := a.Acquire(rand.Uint64(), 0, nil)
		seen[in.PodUID]++
		in.InFlight.Add(-1)
	}
	if seen["1"] != 0 {
		t.Errorf("the most loaded instance was picked %d times", seen["1"])
	}
	for _, uid := range []string{"2", "3", "4"} {
		if seen[uid] < 100 {
			t.Errorf("instance %s picked %d of 1000 times: the draw is not spread", uid, seen[uid])
		}
	}
}

func entryWith(t *testing.T, limit uint32, n int) (*Cache, *Entry) {
	t.Helper()
	var c Cache
	var ids []string
	for i := range n {
		ids = append(ids, string(rune('1'+i)))
	}
	e, _, _ := c.Store(fn, Update{Generation: 1, Instances: infos(ids...), Config: Config{ConcurrencyLimit: limit}})
	return &c, e
}

// waitQueued polls until n requests are queued on e.
func waitQueued(t *testing.T, e *Entry, n int) {
	t.Helper()
	poll.Until(t, 5*time.Second, time.Millisecond, fmt.Sprintf("%d queued", n), func(context.Context) error {
		if q := e.Queued(); q != n {
			return fmt.Errorf("%d queued", q)
		}
		return nil
	})
}

type waited struct {
	in  *Instance
	err error
}

func goWait(ctx context.Context, e *Entry, max int) <-chan waited {
	ch := make(chan waited, 1)
	go func() {
		in, err := e.Wait(ctx, max)
		ch <- waited{in, err}
	}()
	return ch
}

func TestWaitHandOff(t *testing.T) {
	_, e := entryWith(t, 1, 1)
	a := e.Assignment()
	held := a.Acquire(0, 1, nil)
	first := goWait(t.Context(), e, 10)
	waitQueued(t, e, 1)
	second := goWait(t.Context(), e, 10)
	waitQueued(t, e, 2)

	// A newcomer finds the only slot taken and the queue ahead of it.
	if in := a.Acquire(0, 1, nil); in != nil {
		t.Fatal("a newcomer took a slot of a full instance")
	}
	e.Release(held)
	got := <-first
	if got.err != nil || got.in != held {
		t.Fatalf("first waiter got %v, %v; want the released instance", got.in, got.err)
	}
	if n := held.InFlight.Load(); n != 1 {
		t.Errorf("in-flight after the hand-off = %d, want 1 (the slot moved)", n)
	}
	waitQueued(t, e, 1)
	e.Release(got.in)
	if got := <-second; got.in != held {
		t.Fatalf("second waiter got %v, %v", got.in, got.err)
	}
	e.Release(held)
	if n := held.InFlight.Load(); n != 0 || e.Queued() != 0 {
		t.Errorf("afterwards in-flight %d, queued %d; want 0, 0", n, e.Queued())
	}
}

func TestWaitBounds(t *testing.T) {
	_, e := entryWith(t, 1, 1)
	e.Assignment().Acquire(0, 1, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	ch := goWait(ctx, e, 1)
	waitQueued(t, e, 1)
	if _, err := e.Wait(t.Context(), 1); !errors.Is(err, ErrQueueFull) {
		t.Errorf("second waiter with max 1: %v, want ErrQueueFull", err)
	}
	if got := <-ch; !errors.Is(got.err, context.DeadlineExceeded) || got.in != nil {
		t.Errorf("timed out waiter: %v, %v", got.in, got.err)
	}
	if e.Queued() != 0 {
		t.Errorf("queued = %d after the timeout", e.Queued())
	}
}

func TestWaitWokenByAssignment(t *testing.T) {
	c, e := entryWith(t, 1, 1)
	e.Assignment().Acquire(0, 1, nil)
	ch := goWait(t.Context(), e, 10)
	waitQueued(t, e, 1)
	// Scale-up: a new generation with a second instance.
	c.Store(fn, Update{Generation: 2, Instances: infos("1", "2"), Config: Config{ConcurrencyLimit: 1}})
	if got := <-ch; got.err != nil || got.in == nil || got.in.PodUID != "2" {
		t.Fatalf("after scale-up got %v, %v; want instance 2", got.in, got.err)
	}

	ch = goWait(t.Context(), e, 10)
	waitQueued(t, e, 1)
	c.Remove(fn, 2)
	if got := <-ch; got.err != nil || got.in != nil {
		t.Fatalf("after removal got %v, %v; want nil, nil", got.in, got.err)
	}
}

// TestWaitWithdrawnNotHandedOver checks that a slot on an instance that
// left the assignment is not handed to a waiter.
func TestWaitWithdrawnNotHandedOver(t *testing.T) {
	c, e := entryWith(t, 1, 2)
	a := e.Assignment()
	one, two := a.Acquire(draw(0, 0), 1, nil), a.Acquire(draw(1, 0), 1, nil)
	ch := goWait(t.Context(), e, 10)
	waitQueued(t, e, 1)
	// Instance 1 is withdrawn; 2 stays, still full: the waiter queues again.
	c.Store(fn, Update{Generation: 2, Instances: infos("2"), Config: Config{ConcurrencyLimit: 1}})
	waitQueued(t, e, 1)
	e.Release(one)
	if one.InFlight.Load() != 0 {
		t.Errorf("withdrawn instance kept its slot")
	}
	waitQueued(t, e, 1)
	e.Release(two)
	if got := <-ch; got.in != two {
		t.Fatalf("waiter got %v, %v; want instance 2", got.in, got.err)
	}
}

// TestLimitUnderLoad runs many requests through Acquire, Wait and Release
// and checks that no instance ever holds more than the limit and every
// request is served.
func TestLimitUnderLoad(t *testing.T) {
	const limit, instances, workers, rounds = 2, 3, 16, 200
	_, e := entryWith(t, limit, instances)
	var over atomic.Int32
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range rounds {
				a := e.Assignment()
				in := a.Acquire(rand.Uint64(), limit, nil)
				if in == nil {
					var err error
					if in, err = e.Wait(t.Context(), workers); err != nil || in == nil {
						t.Errorf("wait: %v, %v", in, err)
						return
					}
				}
				if in.InFlight.Load() > limit {
					over.Add(1)
				}
				e.Release(in)
			}
		})
	}
	wg.Wait()
	if over.Load() != 0 {
		t.Errorf("an instance held more than %d requests %d times", limit, over.Load())
	}
	if diff := cmp.Diff([]int64{0, 0, 0}, loads(e.Assignment())); diff != "" {
		t.Errorf("in-flight afterwards (-want +got):\n%s", diff)
	}
	if e.Queued() != 0 {
		t.Errorf("queued = %d", e.Queued())
	}
}
