package controller

import (
	"fmt"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"skipper.dev/skipper/controller/api/v1alpha1"
	skipperv1 "skipper.dev/skipper/proto/skipperv1"
)

// hub tracks routers' Connect streams and what each subscribed to, and
// queues AssignmentUpdates for them. Each stream's own goroutine sends;
// publish never blocks on a slow router: per function only the newest
// update is kept.
type hub struct {
	mu      sync.Mutex
	streams map[string]*routerStream // by routerKey
	// logged: the wire fields each router pod's violations were logged for.
	logged map[string]map[string]bool
}

// routerStream is one router's Connect stream as the hub sees it.
type routerStream struct {
	key string
	id  *skipperv1.RouterIdentity

	mu         sync.Mutex
	subs       map[string]bool                        // function keys
	pending    map[string]*skipperv1.AssignmentUpdate // newest unsent update per function
	acked      map[string]uint64                      // generation acknowledged per function
	lastReport time.Time
	lastSeq    uint64
	wake       chan struct{} // cap 1: pending is non-empty
	replaced   chan struct{} // closed when a newer stream of the same router took over
}

func newHub() *hub { return &hub{streams: map[string]*routerStream{}} }

// routerKey identifies a router process: pod and incarnation.
func routerKey(id *skipperv1.RouterIdentity) string {
	if id == nil || id.GetPod() == "" {
		return ""
	}
	return id.GetPod() + "#" + id.GetIncarnation()
}

// maxStreams bounds the router streams one replica holds: a cluster of
// 5,000 nodes has 5,000 DaemonSet routers, plus sidecar routers.
const maxStreams = 20000

// register adds a stream, replacing (and ending) an older one of the same
// router process; ErrTooManyStreams when maxStreams are held already.
func (h *hub) register(id *skipperv1.RouterIdentity) (*routerStream, error) {
	s := &routerStream{
		key: routerKey(id), id: id,
		subs: map[string]bool{}, pending: map[string]*skipperv1.AssignmentUpdate{}, acked: map[string]uint64{},
		wake: make(chan struct{}, 1), replaced: make(chan struct{}),
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	old, ok := h.streams[s.key]
	if !ok && len(h.streams) >= maxStreams {
		return nil, fmt.Errorf("%w: %d router streams held", ErrTooManyStreams, len(h.streams))
	}
	if ok {
		close(old.replaced)
	}
	h.streams[s.key] = s
	return s, nil
}

func (h *hub) unregister(s *routerStream) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.streams[s.key] == s {
		delete(h.streams, s.key)
	}
}

// subscribe adds fn to the subscriptions of the router's stream, if it
// has one; false when the stream holds maxSubscriptions already.
func (h *hub) subscribe(id *skipperv1.RouterIdentity, fnKey string) bool {
	h.mu.Lock()
	s := h.streams[routerKey(id)]
	h.mu.Unlock()
	if s == nil {
		return true
	}
	return s.subscribe(fnKey)
}

// subscribe adds fnKey to the stream's subscriptions unless it holds
// maxSubscriptions others already: a router cannot make the controller
// hold unbounded state by naming functions.
func (s *routerStream) subscribe(fnKey string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.subscribeLocked(fnKey)
}

func (s *routerStream) subscribeLocked(fnKey string) bool {
	if !s.subs[fnKey] && len(s.subs) >= maxSubscriptions {
		return false
	}
	s.subs[fnKey] = true
	return true
}

// unlogged returns the fields of v not logged for the router pod yet, and
// marks them logged: each is logged once per router (across its
// reconnects and incarnations), counted every time. The set is bounded by
// maxStreams routers; past that it starts again.
func (h *hub) unlogged(pod string, v violations) violations {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.logged == nil || (h.logged[pod] == nil && len(h.logged) >= maxStreams) {
		h.logged = map[string]map[string]bool{}
	}
	seen := h.logged[pod]
	if seen == nil {
		seen = map[string]bool{}
		h.logged[pod] = seen
	}
	var out violations
	for f, n := range v {
		if !seen[f] {
			seen[f] = true
			if out == nil {
				out = violations{}
			}
			out[f] = n
		}
	}
	return out
}

// unsubscribeAll drops fnKey from every stream's subscriptions and pending
// updates: this replica no longer answers for it.
func (h *hub) unsubscribeAll(fnKey string) {
	for _, s := range h.all() {
		s.mu.Lock()
		delete(s.subs, fnKey)
		delete(s.pending, fnKey)
		delete(s.acked, fnKey)
		s.mu.Unlock()
	}
}

// all returns the registered streams.
func (h *hub) all() []*routerStream {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*routerStream, 0, len(h.streams))
	for _, s := range h.streams {
		out = append(out, s)
	}
	return out
}

// subscribed reports whether s is subscribed to fnKey.
func (s *routerStream) subscribed(fnKey string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.subs[fnKey]
}

// ackedAll reports whether every stream subscribed to fnKey has
// acknowledged generation gen or a later one (true when none is).
func (h *hub) ackedAll(fnKey string, gen uint64) bool {
	for _, s := range h.all() {
		s.mu.Lock()
		ok := !s.subs[fnKey] || s.acked[fnKey] >= gen
		s.mu.Unlock()
		if !ok {
			return false
		}
	}
	return true
}

// publish queues u for every stream subscribed to fnKey.
func (h *hub) publish(fnKey string, u *skipperv1.AssignmentUpdate) {
	for _, s := range h.all() {
		s.queue(fnKey, u, false)
	}
}

// queue stores u as the pending update of fnKey when the stream is
// subscribed (or force is set) and wakes the sender.
func (s *routerStream) queue(fnKey string, u *skipperv1.AssignmentUpdate, force bool) {
	s.mu.Lock()
	if !force && !s.subs[fnKey] {
		s.mu.Unlock()
		return
	}
	if u.GetRemoved() {
		delete(s.subs, fnKey)
		delete(s.acked, fnKey)
	} else if !s.subscribeLocked(fnKey) {
		s.mu.Unlock()
		return
	}
	s.pending[fnKey] = u
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// take returns and clears the pending updates.
func (s *routerStream) take() []*skipperv1.AssignmentUpdate {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*skipperv1.AssignmentUpdate, 0, len(s.pending))
	for k, u := range s.pending {
		out = append(out, u)
		delete(s.pending, k)
	}
	return out
}

func (s *routerStream) report(seq uint64, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastReport = now
	s.lastSeq = seq
}

// ack records the generation the router acknowledged for fnKey. Only
// subscribed functions are kept: an ack names what the router was sent.
func (s *routerStream) ack(fnKey string, gen uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.subs[fnKey] {
		s.acked[fnKey] = gen
	}
}

func (s *routerStream) state() *skipperv1.RouterState {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := &skipperv1.RouterState{Router: s.id, LastSequence: s.lastSeq}
	if !s.lastReport.IsZero() {
		st.LastReport = timestamp(s.lastReport)
	}
	return st
}

func (h *hub) states() []*skipperv1.RouterState {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*skipperv1.RouterState, 0, len(h.streams))
	for _, s := range h.streams {
		out = append(out, s.state())
	}
	return out
}

func refKey(r *skipperv1.FunctionRef) string { return r.GetNamespace() + "/" + r.GetName() }

func toProtoInstances(set []instance) []*skipperv1.Instance {
	out := make([]*skipperv1.Instance, len(set))
	for i, in := range set {
		out[i] = &skipperv1.Instance{Pod: in.Pod, PodUid: in.UID, Address: in.Address, Node: in.Node}
	}
	return out
}

func (fc functionConfig) proto() *skipperv1.FunctionConfig {
	pc := &skipperv1.FunctionConfig{ConcurrencyLimit: fc.ConcurrencyLimit, Oneshot: fc.Oneshot, Callers: fc.Callers.proto(),
		MaxBodyBytes: fc.MaxBodyBytes}
	if fc.Timeout > 0 {
		pc.Timeout = durationpb.New(fc.Timeout)
	}
	return pc
}

func (st fnState) update(fn *v1alpha1.Function) *skipperv1.AssignmentUpdate {
	return &skipperv1.AssignmentUpdate{
		Function:   &skipperv1.FunctionRef{Namespace: fn.Namespace, Name: fn.Name},
		Generation: st.gen,
		Instances:  toProtoInstances(st.set),
		Config:     st.config.proto(),
	}
}

func removedUpdate(ns, name string, gen uint64) *skipperv1.AssignmentUpdate {
	return &skipperv1.AssignmentUpdate{Function: &skipperv1.FunctionRef{Namespace: ns, Name: name}, Generation: gen, Removed: true}
}

// takeReport checks one report from the router id on stream rs and feeds
// it to the supervisors of the functions this replica owns. A router
// reports every function it routes to that function's owner by its own
// ring view: after an ownership move the new owner learns its subscribers
// here. It returns the checked report and the violations to count.
func (c *controller) takeReport(rs *routerStream, id *skipperv1.RouterIdentity, r *skipperv1.Report, now time.Time) (wireReport, violations) {
	rep, v := checkReport(r, now)
	rs.report(rep.Sequence, now)
	for _, fr := range rep.Functions {
		if !rs.subscribed(fr.Key) && c.owns(fr.Key) {
			v.merge(c.resubscribe(rs, fr.Key, fr.Generation))
		}
		c.observeReport(id, rep, fr, now)
	}
	return rep, v
}

// resubscribe subscribes rs to key, for a router that holds generation gen
// of it: a router holding another generation is sent the current set at
// once; a function this replica holds no state for is computed, which
// publishes it to the new subscriber. A stream at maxSubscriptions is not
// subscribed: the violation is returned.
func (c *controller) resubscribe(rs *routerStream, key string, gen uint64) violations {
	c.mu.Lock()
	_, known := c.fns[key]
	c.mu.Unlock()
	if !known {
		// Only a function this replica watches is subscribed and computed:
		// a router naming functions that do not exist holds no memory and
		// queues no work for them (it asks again with GetInstance).
		ns, name, _ := splitKey(key)
		if _, err := c.cache.function(ns, name); err != nil {
			return nil
		}
	}
	if !rs.subscribe(key) {
		var v violations
		v.add(fieldSubscriptions, "stream holds %d subscriptions already: %s not subscribed", maxSubscriptions, key)
		return v
	}
	c.mu.Lock()
	st, ok := c.fns[key]
	var cur fnState
	if ok {
		cur = *st
	}
	c.mu.Unlock()
	if !ok {
		c.fnQueue.Add(key)
		return nil
	}
	if cur.gen != gen {
		ns, name, _ := splitKey(key)
		rs.queue(key, &skipperv1.AssignmentUpdate{
			Function:   &skipperv1.FunctionRef{Namespace: ns, Name: name},
			Generation: cur.gen,
			Instances:  toProtoInstances(cur.set),
			Config:     cur.config.proto(),
		}, true)
	}
	return nil
}
