package controller

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"skipper.dev/skipper/controller/api/v1alpha1"

	skipperv1 "skipper.dev/skipper/proto/skipperv1"
)

// server implements skipper.v1.Controller over a controller.
type server struct {
	skipperv1.UnimplementedControllerServer
	c *controller
	// closing is closed when shutdown begins: Connect streams end so that
	// GracefulStop need not wait for them.
	closing <-chan struct{}
	// limits bounds the claims each router's GetInstance calls start; nil
	// means no limit.
	limits *claimLimiter
	// authz decides what the authenticated caller may do; nil: --auth none.
	authz *authz
}

var _ skipperv1.ControllerServer = (*server)(nil)

// GetInstance implements skipper.v1.Controller.
func (s *server) GetInstance(ctx context.Context, req *skipperv1.GetInstanceRequest) (*skipperv1.GetInstanceResponse, error) {
	start := time.Now()
	key := refKey(req.GetFunction())
	var resp *skipperv1.GetInstanceResponse
	result := resultError
	v := checkGetInstance(req)
	err := v.err("GetInstance")
	var sidecar *skipperv1.Caller
	if err == nil {
		sidecar, err = s.authz.router(ctx, req.GetRouter(), req.GetForwarded())
	}
	if err == nil {
		if sidecar != nil {
			// A sidecar router serves its own pod only: the caller is the
			// pod its token is bound to, whatever the request says.
			req = proto.Clone(req).(*skipperv1.GetInstanceRequest)
			req.Caller = sidecar
		}
		resp, result, err = s.getInstance(ctx, req)
	}
	s.c.metrics.countViolations(v)
	s.c.metrics.assignmentTime.Observe(time.Since(start).Seconds())
	if validateRef(req.GetFunction().GetNamespace(), req.GetFunction().GetName()) == nil {
		if _, ferr := s.c.cache.function(req.GetFunction().GetNamespace(), req.GetFunction().GetName()); ferr == nil {
			s.c.metrics.assignments.WithLabelValues(key, result).Inc()
		}
	}
	if err != nil {
		st := grpcStatus(err)
		level := slog.LevelWarn
		switch st.Code() {
		case codes.InvalidArgument, codes.NotFound, codes.Canceled, codes.DeadlineExceeded:
			level = slog.LevelDebug // the caller's problem, answered with a clear status
		}
		if errors.Is(err, ErrClaimRateLimited) || st.Code() == codes.PermissionDenied || st.Code() == codes.Unauthenticated {
			// A router over its limit, or a hostile caller, would log every
			// call; counted as result="limited", or in auth_refusals_total.
			level = slog.LevelDebug
		}
		s.c.log.Log(ctx, level, "GetInstance failed", "function", key, "router", req.GetRouter().GetPod(),
			"forwarded", req.GetForwarded(), "code", st.Code().String(), "err", st.Message())
		return nil, st.Err()
	}
	s.c.log.Debug("GetInstance", "function", key, "router", req.GetRouter().GetPod(), "result", result,
		"generation", resp.GetGeneration(), "instances", len(resp.GetInstances()), "took", time.Since(start))
	return resp, nil
}

func (s *server) getInstance(ctx context.Context, req *skipperv1.GetInstanceRequest) (*skipperv1.GetInstanceResponse, string, error) {
	c := s.c
	ns, name := req.GetFunction().GetNamespace(), req.GetFunction().GetName()
	if err := validateRef(ns, name); err != nil {
		return nil, resultError, err
	}
	if !c.cache.synced() {
		return nil, resultError, ErrNotSynced
	}
	key := ns + "/" + name
	if owner := c.owner(key); owner != "" && owner != c.self && !req.GetForwarded() {
		resp, err := c.fwd.getInstance(ctx, owner, req, c.cfg.ForwardTimeout)
		if err != nil {
			return nil, resultError, err
		}
		return resp, resultForwarded, nil
	}
	fn, err := c.cache.function(ns, name)
	if err != nil {
		return nil, resultError, err
	}
	if fn.DeletionTimestamp != nil {
		return nil, resultError, withReason(ErrFunctionDeleting, "function %s is being deleted", key)
	}
	if err := checkCaller(fn, req.GetCaller()); err != nil {
		return nil, resultDenied, err // before the claim: a refused caller wakes nothing
	}
	port, err := c.port(fn)
	if err != nil {
		return nil, resultError, err
	}
	c.touch(key, time.Now())
	caller := s.claimCaller(ctx, req)
	admit := func() error { return s.limits.admit(caller, time.Now()) }
	if fn.Spec.Oneshot {
		return c.getOneshot(ctx, fn, port, req.GetRouter(), admit)
	}
	set, claimed, err := c.ensureInstance(ctx, fn, port, req.GetRouter().GetNode(), req.GetUnusablePodUids(), admit)
	if err != nil {
		return nil, claimResult(err), err
	}
	// The generation describes the full set routers are pushed, unfiltered by
	// this caller's unusable pods.
	st, changed := c.observe(fn, c.currentSet(fn, port, nil), time.Now())
	if changed {
		c.hub.publish(key, st.update(fn))
	}
	if !c.hub.subscribe(req.GetRouter(), key) {
		var v violations
		v.add(fieldSubscriptions, "stream holds %d subscriptions already: %s not subscribed", maxSubscriptions, key)
		c.metrics.countViolations(v)
	}
	result := resultExisting
	if claimed {
		result = resultClaimed
	}
	return &skipperv1.GetInstanceResponse{
		Function:   &skipperv1.FunctionRef{Namespace: ns, Name: name},
		Generation: st.gen,
		Instances:  toProtoInstances(set),
		Config:     st.config.proto(),
		Owner:      c.cfg.PodName,
	}, result, nil
}

// claimResult is the assignments_total result of a failed claim.
func claimResult(err error) string {
	switch {
	case errors.Is(err, ErrPoolEmpty):
		return resultExhausted
	case errors.Is(err, ErrClaimRateLimited):
		return resultLimited
	}
	return resultError
}

// getOneshot claims a fresh instance of a oneshot function for this call
// alone: it is handed back in the response's instance, never put in the
// shared set, and only the router it was handed to may release it. admit,
// when not nil, is asked before the claim starts.
func (c *controller) getOneshot(ctx context.Context, fn *v1alpha1.Function, port int32, router *skipperv1.RouterIdentity, admit func() error) (*skipperv1.GetInstanceResponse, string, error) {
	if router.GetPod() == "" {
		return nil, resultError, withReason(ErrNoRouter, "function %s is oneshot: GetInstance needs router.pod, the only router allowed to release the instance", fn.Key())
	}
	if admit != nil {
		if err := admit(); err != nil {
			return nil, resultLimited, err
		}
	}
	f := c.startFlight(fn, port, flightOneshot, router.GetNode(), router.GetPod(), nil)
	select {
	case <-f.done:
	case <-ctx.Done():
		// Nobody will use or release what the flight claims: delete it.
		c.wg.Go(func() {
			<-f.done
			if f.pod != nil {
				c.claims.retire(f.pod.UID, time.Now().Add(assumedTTL))
				c.deletePod(context.WithoutCancel(c.runCtx), f.pod, "oneshot caller gave up")
			}
		})
		return nil, resultError, ctx.Err()
	}
	if f.err != nil {
		return nil, claimResult(f.err), f.err
	}
	st, _ := c.observe(fn, nil, time.Now())
	in := instanceSet(&v1alpha1.Function{ObjectMeta: fn.ObjectMeta}, port, []*corev1.Pod{f.pod}, nil, nil)
	if len(in) != 1 {
		return nil, resultError, fmt.Errorf("oneshot instance %s/%s of %s is not ready", f.pod.Namespace, f.pod.Name, fn.Key())
	}
	return &skipperv1.GetInstanceResponse{
		Function:   &skipperv1.FunctionRef{Namespace: fn.Namespace, Name: fn.Name},
		Generation: st.gen,
		Instance:   toProtoInstances(in)[0],
		Config:     st.config.proto(),
		Owner:      c.cfg.PodName,
	}, resultClaimed, nil
}

// ReleaseInstance implements skipper.v1.Controller: the router that was
// handed a oneshot instance gives it back, and it is deleted.
func (s *server) ReleaseInstance(ctx context.Context, req *skipperv1.ReleaseInstanceRequest) (*skipperv1.ReleaseInstanceResponse, error) {
	v := checkRelease(req)
	s.c.metrics.countViolations(v)
	var resp *skipperv1.ReleaseInstanceResponse
	err := v.err("ReleaseInstance")
	if err == nil {
		err = s.authz.asRouter(ctx, req.GetRouter(), req.GetForwarded())
	}
	if err == nil {
		resp, err = s.releaseInstance(ctx, req)
	}
	if err != nil {
		st := grpcStatus(err)
		s.c.log.Info("ReleaseInstance refused", "function", refKey(req.GetFunction()), "router", req.GetRouter().GetPod(),
			"pod_uid", req.GetPodUid(), "code", st.Code().String(), "err", st.Message())
		return nil, st.Err()
	}
	return resp, nil
}

func (s *server) releaseInstance(ctx context.Context, req *skipperv1.ReleaseInstanceRequest) (*skipperv1.ReleaseInstanceResponse, error) {
	c := s.c
	ns, name := req.GetFunction().GetNamespace(), req.GetFunction().GetName()
	if err := validateRef(ns, name); err != nil {
		return nil, err
	}
	if req.GetPodUid() == "" {
		return nil, withReason(ErrInvalidName, "ReleaseInstance: pod_uid is required")
	}
	if req.GetRouter().GetPod() == "" {
		return nil, withReason(ErrNoRouter, "ReleaseInstance: router.pod is required")
	}
	if !c.cache.synced() {
		return nil, ErrNotSynced
	}
	key := ns + "/" + name
	if owner := c.owner(key); owner != "" && owner != c.self && !req.GetForwarded() {
		return c.fwd.releaseInstance(ctx, owner, req, c.cfg.ForwardTimeout)
	}
	fn, err := c.cache.function(ns, name)
	if err != nil {
		return nil, err
	}
	if !fn.Spec.Oneshot {
		return nil, withReason(ErrNotOneshot, "function %s is not oneshot: its instances are shared and scaled by the controller", key)
	}
	pods := c.cache.functionPods(ns, name)
	pods = append(pods, c.claims.assumedPods(key, pods, time.Now())...)
	match := func(p *corev1.Pod) bool { return string(p.UID) == req.GetPodUid() && ownedBy(p, fn) }
	i := slices.IndexFunc(pods, match)
	if i < 0 {
		// The previous owner may have claimed it moments ago, before
		// ownership moved here and before this replica's informer saw the
		// claim: ask the API server before refusing.
		live, err := c.core.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelFunction + "=" + name})
		if err != nil {
			return nil, fmt.Errorf("ReleaseInstance: list instances of %s: %w", key, err)
		}
		pods = make([]*corev1.Pod, 0, len(live.Items))
		for j := range live.Items {
			pods = append(pods, &live.Items[j])
		}
		if i = slices.IndexFunc(pods, match); i < 0 {
			return nil, withReason(ErrInstanceNotFound, "function %s has no instance with pod UID %s", key, req.GetPodUid())
		}
	}
	pod := pods[i]
	if holder := pod.Annotations[annOneshotRouter]; holder != req.GetRouter().GetPod() {
		return nil, withReason(ErrNotHolder, "instance %s of %s was handed to router %q, not to %q", pod.Name, key, holder, req.GetRouter().GetPod())
	}
	c.claims.retire(pod.UID, time.Now().Add(assumedTTL))
	c.deletePod(ctx, pod, "oneshot released")
	return &skipperv1.ReleaseInstanceResponse{}, nil
}

// GetState implements skipper.v1.Controller: this replica's ring, routers
// and the functions it holds state for.
func (s *server) GetState(ctx context.Context, req *skipperv1.GetStateRequest) (*skipperv1.GetStateResponse, error) {
	if err := s.authz.state(ctx); err != nil {
		s.c.log.Info("GetState refused", "err", err)
		return nil, err
	}
	c := s.c
	epoch, members := c.ringView()
	resp := &skipperv1.GetStateResponse{
		Controller:  c.cfg.PodName,
		RingEpoch:   epoch,
		RingMembers: append([]string(nil), members...),
		Routers:     c.hub.states(),
	}
	only := ""
	if req.GetFunction() != nil {
		only = refKey(req.GetFunction())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for key, st := range c.fns {
		if only != "" && key != only {
			continue
		}
		ns, name, _ := splitKey(key)
		fs := &skipperv1.FunctionState{
			Function:   &skipperv1.FunctionRef{Namespace: ns, Name: name},
			Owner:      c.owner(key),
			Generation: st.gen,
			Desired:    uint32(len(st.set)),
			Instances:  toProtoInstances(st.set),
		}
		if sup := c.sups[key]; sup != nil {
			if v := sup.view.Load(); v != nil {
				fs.Desired, fs.LastScaleReason = uint32(max(v.desired, 0)), v.reason
				fs.InFlight, fs.Queued = skipperv1.ClampUint32(v.inFlight), skipperv1.ClampUint32(v.queued)
			}
		}
		resp.Functions = append(resp.Functions, fs)
	}
	return resp, nil
}

// Connect implements skipper.v1.Controller: Hello, Welcome, then reports
// and acks up and assignment updates down until either side ends.
func (s *server) Connect(stream grpc.BidiStreamingServer[skipperv1.RouterMessage, skipperv1.ControllerMessage]) error {
	c := s.c
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	hello := first.GetHello()
	if hello == nil {
		return status.Error(codes.InvalidArgument, "the first message on Connect must be a Hello")
	}
	subs, hv, err := checkHello(hello)
	c.metrics.countViolations(hv)
	if err != nil {
		return grpcError(err)
	}
	if err := s.authz.asRouter(stream.Context(), hello.GetRouter(), false); err != nil {
		c.log.Info("Connect refused", "router", hello.GetRouter().GetPod(), "node", hello.GetRouter().GetNode(), "err", err)
		return err
	}
	rs, err := c.hub.register(hello.GetRouter())
	if err != nil {
		return grpcError(err)
	}
	defer c.hub.unregister(rs)
	// A stream is authorised once, at its Hello, with the token it was
	// opened with; it ends when that token does, and the router opens a
	// new one with its renewed token (the kubelet renews a projected token
	// well before it expires).
	expired := tokenExpiry(stream.Context(), s.authz != nil)
	epoch, _ := c.ringView()
	if err := stream.Send(&skipperv1.ControllerMessage{Message: &skipperv1.ControllerMessage_Welcome{Welcome: &skipperv1.Welcome{
		Controller:      c.cfg.PodName,
		ProtocolVersion: skipperv1.ProtocolVersion_PROTOCOL_VERSION_1,
		RingEpoch:       epoch,
		ReportInterval:  durationpb.New(c.cfg.ReportInterval),
	}}}); err != nil {
		return err
	}
	c.metrics.routerStreams.Inc()
	defer c.metrics.routerStreams.Dec()
	log := c.log.With("router", hello.GetRouter().GetPod(), "node", hello.GetRouter().GetNode(),
		"incarnation", hello.GetRouter().GetIncarnation())
	log.Info("router connected", "subscriptions", len(subs))
	// Violations are counted on every message and logged once per router
	// and field: a router sending the same bad value every second, or
	// reconnecting, is one log line, not one a second.
	logViolations := func(v violations) {
		if len(v) == 0 {
			return
		}
		if first := c.hub.unlogged(hello.GetRouter().GetPod(), v); len(first) > 0 {
			log.Warn("router sent values outside their bounds; not applied (logged once per router and field, counted in skipper_controller_wire_violations_total)",
				"violations", first.String())
		}
	}
	logViolations(hv)

	// Re-subscription: a router that holds an older generation than ours
	// gets the current set at once.
	for _, sub := range subs {
		logViolations(c.resubscribe(rs, sub.Key, sub.Generation))
	}

	node := hello.GetRouter().GetNode()
	// The node's series exists from its router's Hello, at zero until the
	// first report: dashboards never come back empty.
	c.metrics.heartbeatBatches.WithLabelValues(node)
	recvDone := make(chan error, 1)
	// The receiver ends when the stream does, which gRPC guarantees once
	// this handler returns; c.wg lets shutdown wait for it.
	c.wg.Go(func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				recvDone <- err
				return
			}
			switch m := m.GetMessage().(type) {
			case *skipperv1.RouterMessage_Report:
				rep, v := c.takeReport(rs, hello.GetRouter(), m.Report, time.Now())
				c.metrics.countViolations(v)
				logViolations(v)
				c.metrics.heartbeatBatches.WithLabelValues(node).Inc()
				log.Debug("report", "sequence", rep.Sequence, "functions", len(rep.Functions))
			case *skipperv1.RouterMessage_Ack:
				key, gen, v, ok := checkAck(m.Ack)
				c.metrics.countViolations(v)
				logViolations(v)
				if ok {
					rs.ack(key, gen)
					log.Debug("ack", "function", key, "generation", gen)
				}
			case *skipperv1.RouterMessage_Hello:
				log.Warn("ignoring a second Hello on one stream")
			}
		}
	})
	for {
		select {
		case <-rs.wake:
			for _, u := range rs.take() {
				if err := stream.Send(&skipperv1.ControllerMessage{Message: &skipperv1.ControllerMessage_Update{Update: u}}); err != nil {
					log.Info("router stream send failed", "err", err)
					return err
				}
			}
		case err := <-recvDone:
			if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
				log.Info("router disconnected")
				return nil
			}
			log.Info("router stream ended", "err", err)
			return err
		case <-rs.replaced:
			log.Info("router stream replaced by a newer one")
			return status.Error(codes.Aborted, "replaced by a newer stream of the same router")
		case <-s.closing:
			return status.Error(codes.Unavailable, ErrShuttingDown.Error())
		case <-expired:
			log.Info("router stream's token expired; the router reconnects with its renewed one")
			return status.Error(codes.Unauthenticated, "the token this stream was opened with has expired: reconnect with the renewed one")
		case <-stream.Context().Done():
			return status.FromContextError(stream.Context().Err()).Err()
		}
	}
}

func timestamp(t time.Time) *timestamppb.Timestamp { return timestamppb.New(t) }

// claimCaller names the caller a GetInstance's claims are charged to.
// With callers authenticated, it is the router the request names, which
// authz checked is the caller (forwarded or not): one bucket per router.
// Without (--auth none), a router's own call is charged to its peer
// address, so renaming itself in the message gains a caller no fresh
// buckets; a forwarded call to the router the message names.
func (s *server) claimCaller(ctx context.Context, req *skipperv1.GetInstanceRequest) string {
	if s.authz == nil && !req.GetForwarded() {
		if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
			if host, _, err := net.SplitHostPort(p.Addr.String()); err == nil {
				return host
			}
			return p.Addr.String()
		}
	}
	return req.GetRouter().GetPod()
}
