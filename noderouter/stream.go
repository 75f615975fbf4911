package noderouter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/util/wait"

	"skipper.dev/skipper/internal/tick"
	"skipper.dev/skipper/noderouter/route"
	pb "skipper.dev/skipper/proto/skipperv1"
)

// streamLoop keeps one Connect stream to c open until ctx ends, reconnecting
// with jittered exponential backoff.
func (cp *controlPlane) streamLoop(ctx context.Context, c *controller) {
	log := cp.log.With("controller", c.addr)
	fresh := func() wait.Backoff {
		return wait.Backoff{Duration: cp.cfg.ReconnectMin, Factor: 2, Cap: cp.cfg.ReconnectMax, Steps: math.MaxInt32}
	}
	backoff := fresh()
	for first := true; ; first = false {
		if !first {
			cp.m.reconnects.Inc()
		}
		welcomed, err := cp.stream(ctx, c)
		if ctx.Err() != nil {
			return
		}
		if welcomed {
			backoff = fresh()
		}
		// Full jitter in [step/2, step) spreads a fleet of routers that
		// lost the same controller.
		step := backoff.Step()
		in := step/2 + rand.N(step/2+1)
		log.Warn("controller stream ended; reconnecting", "err", err, "in", in.String())
		t := time.NewTimer(in)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case ack := <-c.final:
			close(ack) // no stream: no last report to send
		case <-t.C:
		}
	}
}

// stream runs one Connect stream: Hello, then a Report per interval and an
// Ack per applied update, until the stream or ctx ends. welcomed reports
// whether the controller answered the Hello.
func (cp *controlPlane) stream(ctx context.Context, c *controller) (welcomed bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	st, err := c.client.Connect(ctx)
	if err != nil {
		return false, fmt.Errorf("connect: %w", err)
	}
	hello := &pb.Hello{Router: cp.id, Subscriptions: cp.subscriptions(c.addr)}
	if err := st.Send(&pb.RouterMessage{Message: &pb.RouterMessage_Hello{Hello: hello}}); err != nil {
		return false, fmt.Errorf("send hello: %w", err)
	}

	var gotWelcome atomic.Bool
	acks := make(chan *pb.Ack, 64)
	recvErr := make(chan error, 1)
	wg.Go(func() { recvErr <- cp.receive(ctx, st, c, acks, &gotWelcome) })

	t := time.NewTicker(cp.cfg.ReportInterval)
	defer t.Stop()
	var seq uint64
	for {
		select {
		case <-ctx.Done():
			return gotWelcome.Load(), ctx.Err()
		case err := <-recvErr:
			return gotWelcome.Load(), err
		case a := <-acks:
			if err := st.Send(&pb.RouterMessage{Message: &pb.RouterMessage_Ack{Ack: a}}); err != nil {
				return gotWelcome.Load(), fmt.Errorf("send ack: %w", err)
			}
		case now := <-t.C:
			cp.releaseSpares(now.Add(-cp.cfg.ColdStartTimeout))
			seq++
			if err := cp.sendReport(st, c.addr, seq, now); err != nil {
				return gotWelcome.Load(), err
			}
		case ack := <-c.final:
			seq++
			err := cp.sendReport(st, c.addr, seq, time.Now())
			if err == nil {
				err = st.CloseSend()
			}
			close(ack)
			if err != nil {
				return gotWelcome.Load(), fmt.Errorf("last report: %w", err)
			}
			// Nothing more goes up this stream; close cancels it.
			<-ctx.Done()
			return gotWelcome.Load(), ctx.Err()
		}
	}
}

// sendReport builds and sends one report and counts it. The removed
// functions it reported a last time leave the cache once it is sent.
func (cp *controlPlane) sendReport(st grpc.BidiStreamingClient[pb.RouterMessage, pb.ControllerMessage], addr string, seq uint64, now time.Time) error {
	start := time.Now()
	rep, last := cp.report(addr, seq, now)
	if err := st.Send(&pb.RouterMessage{Message: &pb.RouterMessage_Report{Report: rep}}); err != nil {
		return fmt.Errorf("send report: %w", err)
	}
	cp.m.heartbeats.WithLabelValues(addr).Inc()
	cp.m.heartbeatEntries.Observe(float64(len(rep.Functions)))
	cp.m.heartbeatSend.Observe(time.Since(start).Seconds())
	for _, e := range last {
		cp.drop(e, true)
	}
	return nil
}

// drop takes e out of the cache and deletes its function's metric series:
// a removed entry (removed) unless it was stored again (the function came
// back) meanwhile, an idle one unless it holds instances.
func (cp *controlPlane) drop(e *route.Entry, removed bool) {
	if !cp.cache.Drop(e, removed) {
		return
	}
	cp.m.dp.ForgetFunction(e.Key)
	cp.log.Debug("cache entry dropped", "function", e.Key, "removed", removed,
		"requests", e.Requests.Load(), "errors", e.Errors.Load())
}

// sweepLoop drops, every interval until ctx ends, the cache entries that
// served no request for the idle timeout and hold no instance, and the
// removed ones whose last report could not be sent (no stream to their
// owner) once they are idle too.
func (cp *controlPlane) sweepLoop(ctx context.Context, interval time.Duration) {
	tick.Every(ctx, interval, cp.sweep)
}

func (cp *controlPlane) sweep(now time.Time) {
	for _, e := range cp.idle.Expired(cp.cache.Entries(), now, cp.cfg.CacheIdleTimeout) {
		cp.drop(e, false)
	}
}

// receive applies what the controller pushes until the stream ends.
func (cp *controlPlane) receive(ctx context.Context, st grpc.BidiStreamingClient[pb.RouterMessage, pb.ControllerMessage], c *controller, acks chan<- *pb.Ack, welcomed *atomic.Bool) error {
	for {
		msg, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return errors.New("controller closed the stream")
		}
		if err != nil {
			return fmt.Errorf("receive: %w", err)
		}
		switch m := msg.GetMessage().(type) {
		case *pb.ControllerMessage_Welcome:
			welcomed.Store(true)
			c.welcomeOnce.Do(func() { close(c.welcomed) })
			cp.log.Info("controller stream open", "controller", c.addr, "name", m.Welcome.GetController(),
				"ring_epoch", m.Welcome.GetRingEpoch(), "protocol", m.Welcome.GetProtocolVersion().String())
		case *pb.ControllerMessage_Update:
			ack := cp.apply(m.Update)
			if ack == nil {
				continue
			}
			select {
			case acks <- ack:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
}

// apply applies a pushed update and returns the Ack to send, nil when the
// update names no function.
func (cp *controlPlane) apply(u *pb.AssignmentUpdate) *pb.Ack {
	fn := u.GetFunction()
	if fn.GetNamespace() == "" || fn.GetName() == "" {
		return nil
	}
	ref := route.Ref{Namespace: fn.GetNamespace(), Name: fn.GetName()}
	held := u.GetGeneration()
	if u.GetRemoved() {
		held = cp.cache.Remove(ref, u.GetGeneration())
		if held == 0 {
			held = u.GetGeneration()
		}
	} else {
		_, a, applied := cp.cache.Store(ref, toUpdate(u.GetGeneration(), u.GetInstances(), u.GetConfig()))
		held = a.Generation
		cp.log.Debug("assignment update", "function", ref.String(), "generation", u.GetGeneration(),
			"instances", len(u.GetInstances()), "applied", applied)
	}
	// The Ack names the generation the router routes with, which is at
	// least the update's when the update was stale.
	return &pb.Ack{Function: fn, Generation: held}
}

// owned returns the cached entries whose owner is addr on the current ring.
func (cp *controlPlane) owned(addr string) []*route.Entry {
	r := cp.ring.Load()
	if r == nil {
		return nil
	}
	es := cp.cache.Entries()
	return slices.DeleteFunc(es, func(e *route.Entry) bool { return r.Owner(e.Key) != addr })
}

func (cp *controlPlane) subscriptions(addr string) []*pb.Subscription {
	var subs []*pb.Subscription
	for _, e := range cp.owned(addr) {
		if a := e.Assignment(); a != nil {
			subs = append(subs, &pb.Subscription{
				Function:   &pb.FunctionRef{Namespace: e.Ref.Namespace, Name: e.Ref.Name},
				Generation: a.Generation,
			})
		}
	}
	return subs
}

// report builds one heartbeat batch for the controller at addr: every
// cached function it owns, gauges and cumulative counters. last are the
// removed functions with nothing in flight: this report carries their
// final counters, and they leave the cache once it is sent.
func (cp *controlPlane) report(addr string, seq uint64, now time.Time) (rep *pb.Report, last []*route.Entry) {
	rep = &pb.Report{Sequence: seq, Time: timestamppb.New(now), Interval: durationpb.New(cp.cfg.ReportInterval)}
	for _, e := range cp.owned(addr) {
		if e.Gone() {
			last = append(last, e)
		}
		fr := &pb.FunctionReport{
			Function:        &pb.FunctionRef{Namespace: e.Ref.Namespace, Name: e.Ref.Name},
			InFlight:        pb.ClampUint32(e.InFlight.Load()),
			Queued:          uint32(e.Queued()),
			RequestsTotal:   e.Requests.Load(),
			ErrorsTotal:     e.Errors.Load(),
			ColdStartsTotal: e.Cold.Load(),
		}
		if a := e.Assignment(); a != nil {
			fr.Generation = a.Generation
			for _, in := range a.Instances {
				ir := &pb.InstanceReport{
					Pod: in.Pod, PodUid: in.PodUID, InFlight: pb.ClampUint32(in.InFlight.Load()), RequestsTotal: in.Requests.Load(),
				}
				if u, ok := cp.usage.get(in.PodUID); ok {
					if u.hasCPU {
						ir.CpuMillicores = proto.Uint64(u.cpuMillicores)
					}
					if u.hasMemory {
						ir.MemoryBytes = proto.Uint64(u.memoryBytes)
					}
				}
				fr.Instances = append(fr.Instances, ir)
			}
		}
		rep.Functions = append(rep.Functions, fr)
	}
	return rep, last
}
