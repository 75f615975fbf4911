package noderouter

import (
	"context"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "skipper.dev/skipper/proto/skipperv1"
)

// fakeController is a skipper.v1.Controller on loopback. GetInstance answers
// with the function's handler; Connect records what the router sends and
// forwards what a test pushes.
type fakeController struct {
	pb.UnimplementedControllerServer
	addr string

	mu       sync.Mutex
	handlers map[string]func(context.Context, *pb.GetInstanceRequest) (*pb.GetInstanceResponse, error)
	calls    []*pb.GetInstanceRequest
	// streamed records, per GetInstance call, whether a stream had said
	// Hello by then (the controller subscribes only known streams).
	streamed []bool
	hellos   []*pb.Hello
	reports  []*pb.Report
	acks     []*pb.Ack
	releases []*pb.ReleaseInstanceRequest
	// failConnects makes the next n Connect calls fail at once.
	failConnects int
	connects     int

	push chan *pb.ControllerMessage
	kick chan struct{} // ends the current stream
}

// startFakeController serves a fake controller on loopback, with opts
// (TLS credentials, say).
func startFakeController(t *testing.T, opts ...grpc.ServerOption) *fakeController {
	t.Helper()
	f := &fakeController{
		handlers: map[string]func(context.Context, *pb.GetInstanceRequest) (*pb.GetInstanceResponse, error){},
		push:     make(chan *pb.ControllerMessage, 16),
		kick:     make(chan struct{}),
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.addr = ln.Addr().String()
	srv := grpc.NewServer(opts...)
	pb.RegisterControllerServer(srv, f)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return f
}

func (f *fakeController) handle(fn string, h func(context.Context, *pb.GetInstanceRequest) (*pb.GetInstanceResponse, error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.handlers[fn] = h
}

func (f *fakeController) GetInstance(ctx context.Context, req *pb.GetInstanceRequest) (*pb.GetInstanceResponse, error) {
	key := req.GetFunction().GetNamespace() + "/" + req.GetFunction().GetName()
	f.mu.Lock()
	f.calls = append(f.calls, req)
	f.streamed = append(f.streamed, len(f.hellos) > 0)
	h := f.handlers[key]
	f.mu.Unlock()
	if h == nil {
		return nil, statusNotFound(key)
	}
	return h(ctx, req)
}

func (f *fakeController) ReleaseInstance(_ context.Context, req *pb.ReleaseInstanceRequest) (*pb.ReleaseInstanceResponse, error) {
	f.mu.Lock()
	f.releases = append(f.releases, req)
	f.mu.Unlock()
	return &pb.ReleaseInstanceResponse{}, nil
}

func (f *fakeController) Connect(st grpc.BidiStreamingServer[pb.RouterMessage, pb.ControllerMessage]) error {
	f.mu.Lock()
	f.connects++
	fail := f.failConnects > 0
	if fail {
		f.failConnects--
	}
	f.mu.Unlock()
	if fail {
		return statusUnavailable("try again")
	}
	first, err := st.Recv()
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.hellos = append(f.hellos, first.GetHello())
	f.mu.Unlock()
	if err := st.Send(&pb.ControllerMessage{Message: &pb.ControllerMessage_Welcome{Welcome: &pb.Welcome{
		Controller: "fake", ProtocolVersion: pb.ProtocolVersion_PROTOCOL_VERSION_1,
	}}}); err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() {
		for {
			m, err := st.Recv()
			if err != nil {
				errc <- err
				return
			}
			f.mu.Lock()
			switch m := m.GetMessage().(type) {
			case *pb.RouterMessage_Report:
				f.reports = append(f.reports, m.Report)
			case *pb.RouterMessage_Ack:
				f.acks = append(f.acks, m.Ack)
			}
			f.mu.Unlock()
		}
	}()
	for {
		select {
		case err := <-errc:
			return err
		case <-f.kick:
			return statusUnavailable("kicked")
		case m := <-f.push:
			if err := st.Send(m); err != nil {
				<-errc
				return err
			}
		}
	}
}

func (f *fakeController) getCalls() []*pb.GetInstanceRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*pb.GetInstanceRequest(nil), f.calls...)
}

// holds makes cond a poll.Until condition on what the fake received: it
// runs under f's lock and says what it saw.
func (f *fakeController) holds(cond func(f *fakeController) error) func(context.Context) error {
	return func(context.Context) error {
		f.mu.Lock()
		defer f.mu.Unlock()
		return cond(f)
	}
}

func statusNotFound(fn string) error {
	return status.Errorf(codes.NotFound, "function %s not found", fn)
}

func statusUnavailable(msg string) error { return status.Error(codes.Unavailable, msg) }
