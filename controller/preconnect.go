package controller

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/controller/assign"
	"skipper.dev/skipper/internal/tick"
)

// Pre-connection (issue 15, the first call): a claim's assign used to open
// a new TCP connection to the instance, and on the 2-core VM the dial and
// the connection's goroutines were about a seventh of the controllers' CPU
// on the cold path (perf, in docs/benchmarks.md). Each replica keeps one
// idle kept-alive connection to every ready pool pod (at most
// preconnectMax; the walk takes the ring's own first, events admit pods
// as they come), opened by the
// read-only GET of the assign endpoint when the pod turns ready (or when
// the replica's walk of the cache every preconnectTick finds it) and
// renewed before the instance's idle timeout could close it, so the assign
// is written on a connection already open. Not only the ring's own pods: a
// replica with none of its own ready takes another's (claimCandidates),
// and with a pool of 3 and 3 replicas that was about a third of the
// claims, each of which dialled.

// preconnectRenew is how long a pre-opened connection goes before it is
// used again (the GET once more): under the idle timeouts of the echo
// runtime (2 minutes) and of c.http (assignIdleTimeout).
const preconnectRenew = 50 * time.Second

// assignIdleTimeout is how long c.http keeps an idle connection to an
// instance.
const assignIdleTimeout = 90 * time.Second

// assignDialTimeout bounds a dial to an instance (an assign's or a
// pre-connection's), within --assign-timeout: a pod that is there answers
// at once, or after a lost SYN or two (1 s, 3 s); one that is gone fails
// its ARP in 3 s, or never answers at all.
const assignDialTimeout = 4 * time.Second

// preconnectParallel bounds the pre-connections opened at once.
const preconnectParallel = 4

// preconnectMax bounds the pool pods one replica holds a connection to
// (under c.http's MaxIdleConns, so none is evicted for another).
const preconnectMax = 512

// preconnects remembers when this replica last connected to each pool
// pod (by UID) and the token format its answer asked for; its own lock,
// taken alone. The pods themselves are always read from the informer
// cache.
type preconnects struct {
	mu      sync.Mutex
	at      map[types.UID]time.Time
	formats map[types.UID]string // only of UIDs in at
	slots   chan struct{}
}

func newPreconnects() *preconnects {
	return &preconnects{at: map[types.UID]time.Time{}, formats: map[types.UID]string{},
		slots: make(chan struct{}, preconnectParallel)}
}

// answered records the token formats a GET answer of uid listed
// (assign.HeaderTokenFormats), if uid is held.
func (pc *preconnects) answered(uid types.UID, listed string) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if _, ok := pc.at[uid]; ok {
		pc.formats[uid] = assign.PickFormat(listed)
	}
}

// format is the token format to assign uid with: the one its last GET
// answer asked for, assign.FormatV1 (every instance's) when none was had.
func (pc *preconnects) format(uid types.UID) string {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if f, ok := pc.formats[uid]; ok {
		return f
	}
	return assign.FormatV1
}

// due reports whether uid's connection should be (re)opened at now; if so
// it is marked as opened at now. A new uid is refused while max are held.
func (pc *preconnects) due(uid types.UID, now time.Time, max int) bool {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	at, ok := pc.at[uid]
	if ok && now.Sub(at) < preconnectRenew || !ok && len(pc.at) >= max {
		return false
	}
	pc.at[uid] = now
	return true
}

// later makes uid's connection due at the next renewal.
func (pc *preconnects) later(uid types.UID) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if _, ok := pc.at[uid]; ok {
		pc.at[uid] = time.Time{}
	}
}

// forget drops uid (its pod is gone, claimed or not ready).
func (pc *preconnects) forget(uid types.UID) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	delete(pc.at, uid)
	delete(pc.formats, uid)
}

// keepOnly forgets every UID not in live.
func (pc *preconnects) keepOnly(live map[types.UID]bool) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	for uid := range pc.at {
		if !live[uid] {
			delete(pc.at, uid)
			delete(pc.formats, uid)
		}
	}
}

// preconnect opens the kept-alive connection to pool pod p, as an
// informer event shows it, when it is due, in the background: the GET
// leaves its connection idle in c.http for the assign. A pod that stops
// qualifying is forgotten; with every slot busy the next renewal opens it.
func (c *controller) preconnect(p *corev1.Pod, deleted bool) {
	port, ok := v1alpha1.WarmPoolPodPort(p)
	if deleted || !ok {
		c.preconn.forget(p.UID)
		return
	}
	ctx := c.ctx()
	if ctx == nil || ctx.Err() != nil || !c.preconn.due(p.UID, time.Now(), preconnectMax) {
		return
	}
	select {
	case c.preconn.slots <- struct{}{}:
		c.openPreconnect(ctx, p, port)
	default:
		c.preconn.later(p.UID)
	}
}

// openPreconnect sends the GET to p on c.wg, holding a slot the caller
// took.
func (c *controller) openPreconnect(ctx context.Context, p *corev1.Pod, port int32) {
	c.wg.Go(func() {
		defer func() { <-c.preconn.slots }()
		actx, cancel := context.WithTimeout(ctx, c.cfg.AssignTimeout)
		defer cancel()
		if _, err := c.askInstance(actx, p, port); err != nil {
			c.preconn.later(p.UID)
			c.log.Debug("pre-connect to pool pod failed", "pod", p.Namespace+"/"+p.Name, "err", err)
		}
	})
}

// preconnectTick is how often renewPreconnects looks for connections due.
const preconnectTick = 5 * time.Second

// renewPreconnects, every preconnectTick, walks the cached pool pods (the
// ring's own first, so that they are the ones held when preconnectMax
// bounds the rest) and opens the connections due: new ones (pods no event
// announced, or refused for the bound), those preconnectRenew old, so that none lapses
// while its pod stays warm, and those that failed or found no free slot;
// it waits for a slot rather than skip. It returns when ctx ends.
func (c *controller) renewPreconnects(ctx context.Context) {
	tick.After(ctx, preconnectTick, func(time.Time) {
		live := map[types.UID]bool{}
		for _, p := range mineFirst(c.cache.unclaimedPoolPods(), c.owns) {
			port, ok := v1alpha1.WarmPoolPodPort(p)
			if !ok {
				continue
			}
			live[p.UID] = true
			if !c.preconn.due(p.UID, time.Now(), preconnectMax) {
				continue
			}
			select {
			case c.preconn.slots <- struct{}{}:
				c.openPreconnect(ctx, p, port)
			case <-ctx.Done():
				return
			}
		}
		c.preconn.keepOnly(live)
	})
}

// mineFirst returns pods with those mine gives this replica first, keeping
// the order within each part (one ring lookup per pod).
func mineFirst(pods []*corev1.Pod, mine func(uid string) bool) []*corev1.Pod {
	out := make([]*corev1.Pod, 0, len(pods))
	var theirs []*corev1.Pod
	for _, p := range pods {
		if mine(string(p.UID)) {
			out = append(out, p)
		} else {
			theirs = append(theirs, p)
		}
	}
	return append(out, theirs...)
}

// ctx is the controller's run context, nil before start.
func (c *controller) ctx() context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.runCtx
}
