package noderouter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"skipper.dev/skipper/controller/ring"
	"skipper.dev/skipper/noderouter/callers"
	"skipper.dev/skipper/noderouter/dataplane"
	"skipper.dev/skipper/noderouter/route"
	pb "skipper.dev/skipper/proto/skipperv1"
)

// controlPlane is the router's side of the controllers: the ring built from
// the current members, one gRPC connection and one Connect stream per
// controller the router has talked to, and the cache misses it resolves.
type controlPlane struct {
	cfg   Config
	log   *slog.Logger
	m     *metrics
	cache *route.Cache
	// negative holds functions GetInstance reported NotFound (nil: off).
	negative *route.Negative
	id       *pb.RouterIdentity
	// usage holds the local instances' cgroup figures (nil: not read).
	usage *usageSampler
	// creds is the router's token for every call; nil: none.
	creds *pb.TokenFile
	// transport, when set before the first dial, secures connections to
	// controllers (TLS, --controller-tls-dir); nil: plaintext.
	transport credentials.TransportCredentials
	// dialer, when set before the first dial, dials controllers (the router
	// marks its sockets so BPF steering skips them); nil: gRPC's default.
	dialer *net.Dialer

	// ctx bounds every call and stream; cancelled by close.
	ctx    context.Context
	cancel context.CancelFunc

	ring atomic.Pointer[ring.Ring] // nil while there are no members
	sf   singleflight.Group

	mu     sync.Mutex
	ctrls  map[string]*controller // by address
	closed bool
	wg     sync.WaitGroup // stream loops
	// calls counts GetInstance and ReleaseInstance calls in flight; Add
	// only under mu while not closed (begin), so close can Wait for them.
	calls sync.WaitGroup

	spareMu sync.Mutex
	spares  map[route.Ref]spare // oneshot instances not yet taken

	idle route.Idle // owned by sweepLoop
}

var _ dataplane.Resolver = (*controlPlane)(nil)

func newControlPlane(cfg Config, log *slog.Logger, m *metrics, cache *route.Cache, negative *route.Negative, id *pb.RouterIdentity) *controlPlane {
	ctx, cancel := context.WithCancel(context.Background())
	cp := &controlPlane{cfg: cfg, log: log, m: m, cache: cache, negative: negative, id: id, ctx: ctx, cancel: cancel, ctrls: map[string]*controller{}}
	if cfg.TokenFile != "" {
		if _, err := os.Stat(cfg.TokenFile); err != nil {
			log.Warn("no token file: calls to the controllers carry no token, and controllers that authenticate callers refuse them",
				"token_file", cfg.TokenFile, "err", err)
		} else {
			cp.creds = pb.NewTokenFile(cfg.TokenFile)
		}
	}
	return cp
}

// controller is one controller replica: its connection and its stream loop.
type controller struct {
	addr   string
	cc     *grpc.ClientConn
	client pb.ControllerClient
	cancel context.CancelFunc
	done   chan struct{}
	// welcomed is closed once a stream has been welcomed. GetInstance
	// subscribes the caller's stream only if the controller knows it, so
	// the first GetInstance waits (briefly) for it.
	welcomed    chan struct{}
	welcomeOnce sync.Once
	// final asks the stream loop for one last report; it closes the
	// channel it is given once the report is sent.
	final chan chan struct{}
}

// welcomeWait bounds how long the first GetInstance to a controller waits
// for its stream's Welcome. A controller whose Connect fails still gets the
// GetInstance after it; the router re-subscribes in its next Hello.
const welcomeWait = 500 * time.Millisecond

// setMembers installs a new ring. Streams to controllers that left are
// stopped; streams to the owners of cached functions are started, so their
// reports follow ownership.
func (cp *controlPlane) setMembers(members []string) {
	r, err := ring.New(members)
	if err != nil {
		r = nil
	}
	old := cp.ring.Swap(r)
	if old != nil && r != nil && old.Epoch() == r.Epoch() {
		return
	}
	cp.log.Info("controller ring changed", "members", members)

	cp.mu.Lock()
	var stop []*controller
	for addr, c := range cp.ctrls {
		if r == nil || !r.Has(addr) {
			stop = append(stop, c)
			delete(cp.ctrls, addr)
		}
	}
	cp.mu.Unlock()
	for _, c := range stop {
		c.stop()
	}
	if r == nil {
		return
	}
	for _, e := range cp.cache.Entries() {
		if e.Assignment() != nil {
			if _, err := cp.controller(r.Owner(e.Key)); err != nil {
				cp.log.Warn("connect to owner", "function", e.Key, "err", err)
			}
		}
	}
}

// controller returns the connection to addr, dialling it and starting its
// stream loop on first use.
func (cp *controlPlane) controller(addr string) (*controller, error) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if cp.closed {
		return nil, status.Error(codes.Unavailable, "router is shutting down")
	}
	if c := cp.ctrls[addr]; c != nil {
		return c, nil
	}
	// passthrough: members are ip:port, never names to resolve.
	transport := cp.transport
	if transport == nil {
		transport = insecure.NewCredentials()
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(transport)}
	if cp.creds != nil {
		opts = append(opts, grpc.WithPerRPCCredentials(cp.creds)) // authorization: Bearer <projected token>
	}
	if cp.dialer != nil {
		d := cp.dialer
		opts = append(opts, grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", a)
		}))
	}
	cc, err := grpc.NewClient("passthrough:///"+addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("grpc client for %s: %w", addr, err)
	}
	ctx, cancel := context.WithCancel(cp.ctx)
	c := &controller{addr: addr, cc: cc, client: pb.NewControllerClient(cc), cancel: cancel,
		done: make(chan struct{}), welcomed: make(chan struct{}), final: make(chan chan struct{}, 1)}
	cp.ctrls[addr] = c
	cp.m.heartbeats.WithLabelValues(addr)
	cp.wg.Go(func() {
		defer close(c.done)
		cp.streamLoop(ctx, c)
	})
	return c, nil
}

// stop ends c's stream loop and closes its connection.
func (c *controller) stop() {
	c.cancel()
	<-c.done
	_ = c.cc.Close()
}

// finalReportWait bounds how long close waits for the last reports.
const finalReportWait = 2 * time.Second

// close releases the oneshot instances no request took, sends one last
// report on every open stream (the router has drained: it carries the
// final counters and zero in-flight), stops every stream and connection
// and waits for them.
func (cp *controlPlane) close() {
	cp.releaseSpares(time.Time{})
	cp.mu.Lock()
	cp.closed = true
	ctrls := cp.ctrls
	cp.ctrls = map[string]*controller{}
	cp.mu.Unlock()
	var acks []chan struct{}
	for _, c := range ctrls {
		ack := make(chan struct{})
		select {
		case c.final <- ack:
			acks = append(acks, ack)
		default:
		}
	}
	t := time.NewTimer(finalReportWait)
	for _, ack := range acks {
		select {
		case <-ack:
		case <-t.C:
			cp.log.Warn("last report not sent in time", "wait", finalReportWait.String())
		}
	}
	t.Stop()
	cp.cancel()
	for _, c := range ctrls {
		c.stop()
	}
	cp.wg.Wait()
	cp.calls.Wait()
}

// resolve asks the function's owner for its instance set. Concurrent misses
// of one function share one call, bounded by the cold-start timeout and not
// by any one caller: a caller that goes away does not fail the others.
func (cp *controlPlane) Resolve(ctx context.Context, ref route.Ref, known uint64, unusable []string, who dataplane.Caller) (*route.Entry, *route.Assignment, error) {
	type result struct {
		e *route.Entry
		a *route.Assignment
	}
	key := ref.String()
	// Callers share a call only with callers of the same identity: the
	// owner may refuse one identity and serve another.
	ch := cp.sf.DoChan(key+"\x00"+who.Key(), func() (any, error) {
		if !cp.begin() {
			return nil, status.Error(codes.Unavailable, "router is shutting down")
		}
		defer cp.calls.Done()
		// A caller that checked the negative cache just before the previous
		// call stored its NotFound joins no call: answer it from the cache.
		if cp.negative.Contains(ref, time.Now()) {
			return nil, status.Errorf(codes.NotFound, "function %s not found", key)
		}
		e, a, err := cp.getInstance(ref, key, known, unusable, who)
		return result{e, a}, err
	})
	select {
	case res := <-ch:
		if res.Err != nil {
			return nil, nil, res.Err
		}
		r := res.Val.(result)
		return r.e, r.a, nil
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
}

func (cp *controlPlane) getInstance(ref route.Ref, key string, known uint64, unusable []string, who dataplane.Caller) (*route.Entry, *route.Assignment, error) {
	start := time.Now()
	resp, err := cp.ask(cp.ctx, ref, key, known, unusable, who)
	if err != nil {
		return nil, nil, err
	}
	e, a, applied := cp.cache.Store(ref, toUpdate(resp.GetGeneration(), resp.GetInstances(), resp.GetConfig()))
	e.Cold.Add(1)
	if resp.GetConfig().GetOneshot() && resp.GetInstance().GetAddress() != "" {
		// The instance is for one request, but this call may be shared by
		// several: the first to ask for a oneshot instance takes it.
		cp.putSpare(ref, toInfo(resp.GetInstance()), time.Now())
	}
	cp.log.Debug("GetInstance", "function", key, "generation", resp.GetGeneration(),
		"instances", len(resp.GetInstances()), "applied", applied, "took", time.Since(start))
	return e, a, nil
}

// ask sends one GetInstance to the function's owner, bounded by ctx and the
// cold-start timeout, and counts it. A NotFound goes to the negative cache.
func (cp *controlPlane) ask(ctx context.Context, ref route.Ref, key string, known uint64, unusable []string, who dataplane.Caller) (*pb.GetInstanceResponse, error) {
	r := cp.ring.Load()
	if r == nil {
		cp.m.getInstance.WithLabelValues(dataplane.ResultUnavailable).Inc()
		return nil, status.Error(codes.Unavailable, "no ready controller (the ring is empty)")
	}
	owner := r.Owner(key)
	c, err := cp.controller(owner)
	if err != nil {
		cp.m.getInstance.WithLabelValues(dataplane.ResultUnavailable).Inc()
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	ctx, cancel := context.WithTimeout(ctx, cp.cfg.ColdStartTimeout)
	defer cancel()
	start := time.Now()
	select {
	case <-c.welcomed:
	default:
		t := time.NewTimer(welcomeWait)
		select {
		case <-c.welcomed:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	resp, err := c.client.GetInstance(ctx, &pb.GetInstanceRequest{
		Function:        &pb.FunctionRef{Namespace: ref.Namespace, Name: ref.Name},
		Router:          cp.id,
		KnownGeneration: known,
		UnusablePodUids: unusable,
		Caller:          callerProto(who),
	})
	cp.m.getInstanceSecs.Observe(time.Since(start).Seconds())
	if err != nil {
		cp.m.getInstance.WithLabelValues(dataplane.ControllerResult(err)).Inc()
		if status.Code(err) == codes.NotFound {
			cp.negative.Add(ref, time.Now())
			// The function is gone (deleted while no update reached this
			// router): its entry leaves after one last report.
			cp.cache.Remove(ref, known)
		}
		cp.log.Info("GetInstance failed", "function", key, "controller", owner, "code", status.Code(err).String(), "err", err)
		return nil, err
	}
	cp.m.getInstance.WithLabelValues(dataplane.ResultOK).Inc()
	return resp, nil
}

// begin counts a control-plane call close must wait for; false when the
// router is shutting down.
func (cp *controlPlane) begin() bool {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if cp.closed {
		return false
	}
	cp.calls.Add(1)
	return true
}

// oneshot returns a fresh instance of a oneshot function for one request:
// one left by a shared cold miss, or one GetInstance of its own (never
// shared: every request needs its own instance). The caller releases it.
func (cp *controlPlane) Oneshot(ctx context.Context, ref route.Ref, who dataplane.Caller) (*route.Instance, error) {
	if info, ok := cp.takeSpare(ref); ok {
		return &route.Instance{InstanceInfo: info}, nil
	}
	if !cp.begin() {
		return nil, status.Error(codes.Unavailable, "router is shutting down")
	}
	defer cp.calls.Done()
	key := ref.String()
	var known uint64
	if _, a := cp.cache.Lookup(ref); a != nil {
		known = a.Generation
	}
	resp, err := cp.ask(ctx, ref, key, known, nil, who)
	if err != nil {
		return nil, err
	}
	e, _, _ := cp.cache.Store(ref, toUpdate(resp.GetGeneration(), resp.GetInstances(), resp.GetConfig()))
	e.Cold.Add(1)
	info := toInfo(resp.GetInstance())
	if !resp.GetConfig().GetOneshot() || info.Address == "" {
		// The function is no longer oneshot (the cache now says so), or
		// the controller handed out nothing.
		if info.Address != "" {
			cp.Release(ref, info.PodUID)
		}
		return nil, status.Errorf(codes.Unavailable, "the controller handed out no oneshot instance of %s", key)
	}
	return &route.Instance{InstanceInfo: info}, nil
}

// release gives a oneshot instance back to the function's owner
// (ReleaseInstance), bounded by the cold-start timeout; the request it
// served may have been cancelled, this call is not.
func (cp *controlPlane) Release(ref route.Ref, podUID string) {
	key := ref.String()
	err := func() error {
		if !cp.begin() {
			return errors.New("router is shutting down")
		}
		defer cp.calls.Done()
		r := cp.ring.Load()
		if r == nil {
			return errors.New("no ready controller (the ring is empty)")
		}
		c, err := cp.controller(r.Owner(key))
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(cp.ctx, cp.cfg.ColdStartTimeout)
		defer cancel()
		_, err = c.client.ReleaseInstance(ctx, &pb.ReleaseInstanceRequest{
			Function: &pb.FunctionRef{Namespace: ref.Namespace, Name: ref.Name},
			Router:   cp.id,
			PodUid:   podUID,
		})
		return err
	}()
	if err != nil {
		cp.m.releases.WithLabelValues(dataplane.ResultError).Inc()
		cp.log.Warn("ReleaseInstance failed; the controller reclaims the instance", "function", key, "pod_uid", podUID, "err", err)
		return
	}
	cp.m.releases.WithLabelValues(dataplane.ResultOK).Inc()
}

// spare is a oneshot instance a shared cold miss received and no request
// has taken yet.
type spare struct {
	info route.InstanceInfo
	at   time.Time
}

// putSpare keeps info for the next oneshot request of ref; a spare it
// replaces is released.
func (cp *controlPlane) putSpare(ref route.Ref, info route.InstanceInfo, now time.Time) {
	cp.spareMu.Lock()
	old, had := cp.spares[ref]
	if cp.spares == nil {
		cp.spares = map[route.Ref]spare{}
	}
	cp.spares[ref] = spare{info: info, at: now}
	cp.spareMu.Unlock()
	if had {
		cp.Release(ref, old.info.PodUID)
	}
}

func (cp *controlPlane) takeSpare(ref route.Ref) (route.InstanceInfo, bool) {
	cp.spareMu.Lock()
	defer cp.spareMu.Unlock()
	s, ok := cp.spares[ref]
	if ok {
		delete(cp.spares, ref)
	}
	return s.info, ok
}

// releaseSpares releases the spares kept since before cutoff (every one
// for the zero time): the requests they were fetched for went away.
func (cp *controlPlane) releaseSpares(cutoff time.Time) {
	cp.spareMu.Lock()
	var stale []route.Ref
	var uids []string
	for ref, s := range cp.spares {
		if cutoff.IsZero() || s.at.Before(cutoff) {
			stale = append(stale, ref)
			uids = append(uids, s.info.PodUID)
			delete(cp.spares, ref)
		}
	}
	cp.spareMu.Unlock()
	for i, ref := range stale {
		cp.Release(ref, uids[i])
	}
}

func toInfo(in *pb.Instance) route.InstanceInfo {
	return route.InstanceInfo{Pod: in.GetPod(), PodUID: in.GetPodUid(), Address: in.GetAddress(), Node: in.GetNode()}
}

func toUpdate(gen uint64, ins []*pb.Instance, cfg *pb.FunctionConfig) route.Update {
	u := route.Update{Generation: gen, Instances: make([]route.InstanceInfo, 0, len(ins))}
	for _, in := range ins {
		if in.GetAddress() == "" {
			continue
		}
		u.Instances = append(u.Instances, toInfo(in))
	}
	if cfg != nil {
		u.Config = route.Config{ConcurrencyLimit: cfg.GetConcurrencyLimit(), Oneshot: cfg.GetOneshot(),
			MaxBodyBytes: max(cfg.GetMaxBodyBytes(), 0)}
		if cfg.GetTimeout() != nil {
			u.Config.Timeout = cfg.GetTimeout().AsDuration()
		}
		u.Config.Callers = callers.NewPolicy(cfg.GetCallers().GetNamespaces(), cfg.GetCallers().GetServiceAccounts())
	}
	return u
}

// callerProto is c as GetInstance sends it.
func callerProto(c dataplane.Caller) *pb.Caller {
	if !c.Known {
		return &pb.Caller{Unknown: true}
	}
	return &pb.Caller{Namespace: c.ID.Namespace, ServiceAccount: c.ID.ServiceAccount, Pod: c.ID.Pod}
}
