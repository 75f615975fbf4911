package controller

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/internal/poll"
	skipperv1 "skipper.dev/skipper/proto/skipperv1"
)

// fuzzServer starts one replica on loopback over a fake clientset holding
// a shared function "hello" and a oneshot "once" on pool echo with a few
// pods, whose assign endpoint accepts everything. It stops when tb ends.
func fuzzServer(tb testing.TB) skipperv1.ControllerClient {
	tb.Helper()
	assignSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	tb.Cleanup(assignSrv.Close)
	_, p, _ := net.SplitHostPort(assignSrv.Listener.Addr().String())
	port, _ := strconv.Atoi(p)

	core := fake.NewClientset()
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{v1alpha1.Resource: "FunctionList"})
	ctx := context.Background()
	if _, err := core.AppsV1().Deployments("default").Create(ctx, poolDeploy("echo"), metav1.CreateOptions{}); err != nil {
		tb.Fatal(err)
	}
	for _, n := range []string{"p1", "p2", "p3"} {
		if _, err := core.CoreV1().Pods("default").Create(ctx, poolPod(n, "echo"), metav1.CreateOptions{}); err != nil {
			tb.Fatal(err)
		}
	}
	for _, fn := range []*v1alpha1.Function{testFunction("hello"), testFunction("once")} {
		fn.Spec.Pool, fn.Spec.Port = "echo", int32(port)
		fn.Spec.Oneshot = fn.Name == "once"
		u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(fn)
		if err != nil {
			tb.Fatal(err)
		}
		us := &unstructured.Unstructured{Object: u}
		us.SetAPIVersion(v1alpha1.SchemeGroupVersion.String())
		us.SetKind("Function")
		if _, err := dyn.Resource(v1alpha1.Resource).Namespace("default").Create(ctx, us, metav1.CreateOptions{}); err != nil {
			tb.Fatal(err)
		}
	}

	grpcLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	httpLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	cfg := validConfig()
	cfg.PodName, cfg.PodNamespace, cfg.PodIP = "ctl-0", systemNS, "127.0.0.1"
	cfg.ClaimTimeout, cfg.AssignTimeout, cfg.ShutdownTimeout = 50*time.Millisecond, 500*time.Millisecond, 2*time.Second
	if err := cfg.Validate(); err != nil {
		tb.Fatal(err)
	}
	sctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := serve(sctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), clients{core: core, dyn: dyn}, grpcLis, httpLis); err != nil {
			tb.Errorf("serve: %v", err)
		}
	})
	conn, err := grpc.NewClient("passthrough:///"+grpcLis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		conn.Close()
		cancel()
		wg.Wait()
	})
	client := skipperv1.NewControllerClient(conn)
	// Serve only once the caches have synced: until then every call is
	// Unavailable (ErrNotSynced), which a target's check after its input
	// would take for the server's failure (a CI rehearsal met it).
	poll.Until(tb, 10*time.Second, pollInterval, "the server synced", func(context.Context) error {
		_, err := client.GetInstance(ctx, &skipperv1.GetInstanceRequest{Function: ref("default", "missing")})
		if status.Code(err) == codes.Unavailable {
			return err
		}
		return nil
	})
	return client
}

// FuzzServer sends arbitrary bytes, decoded as GetInstanceRequest or
// ReleaseInstanceRequest, through a real gRPC server on loopback: the
// server never panics and every answer is a response or a gRPC status
// with a code the contract names.
func FuzzServer(f *testing.F) {
	seed := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	router := &skipperv1.RouterIdentity{Node: "node-1", Pod: "skipper-system/router-a", Incarnation: "i1"}
	f.Add(false, seed(&skipperv1.GetInstanceRequest{Function: ref("default", "hello"), Router: router}))
	f.Add(false, seed(&skipperv1.GetInstanceRequest{Function: ref("default", "once"), Router: router, UnusablePodUids: []string{"uid-p1"}}))
	f.Add(false, seed(&skipperv1.GetInstanceRequest{Function: ref("default", "missing"), Forwarded: true}))
	f.Add(false, seed(&skipperv1.GetInstanceRequest{Function: ref("Bad", "x/y")}))
	f.Add(true, seed(&skipperv1.ReleaseInstanceRequest{Function: ref("default", "once"), Router: router, PodUid: "uid-p2"}))
	f.Add(true, seed(&skipperv1.ReleaseInstanceRequest{Function: ref("default", "hello"), PodUid: "uid-p1"}))
	f.Add(true, []byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f})

	client := fuzzServer(f)
	f.Fuzz(func(t *testing.T, release bool, data []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var err error
		if release {
			var req skipperv1.ReleaseInstanceRequest
			if proto.Unmarshal(data, &req) != nil {
				t.Skip("not a ReleaseInstanceRequest")
			}
			_, err = client.ReleaseInstance(ctx, &req)
		} else {
			var req skipperv1.GetInstanceRequest
			if proto.Unmarshal(data, &req) != nil {
				t.Skip("not a GetInstanceRequest")
			}
			_, err = client.GetInstance(ctx, &req)
		}
		if err == nil {
			return
		}
		st, ok := status.FromError(err)
		if !ok {
			t.Fatalf("answer %v is not a gRPC status", err)
		}
		switch st.Code() {
		case codes.InvalidArgument, codes.NotFound, codes.FailedPrecondition, codes.ResourceExhausted,
			codes.Unavailable, codes.PermissionDenied, codes.DeadlineExceeded:
		default:
			t.Fatalf("answer %v: code %v is not one the contract names", err, st.Code())
		}
	})
}

// FuzzConnect opens a Connect stream on a real server on loopback and sends
// a Hello and then arbitrary RouterMessages (each data split at 0xff bytes,
// every part decoded as one message): the server never panics, answers
// the Hello with a Welcome or ends the stream with a gRPC status the
// contract names, and serves a GetInstance afterwards.
func FuzzConnect(f *testing.F) {
	seed := func(ms ...proto.Message) []byte {
		var out []byte
		for i, m := range ms {
			b, err := proto.Marshal(m)
			if err != nil {
				f.Fatal(err)
			}
			if i > 0 {
				out = append(out, 0xff)
			}
			out = append(out, b...)
		}
		return out
	}
	router := &skipperv1.RouterIdentity{Node: "node-1", Pod: "skipper-system/router-a", Incarnation: "i1"}
	hello := &skipperv1.RouterMessage{Message: &skipperv1.RouterMessage_Hello{Hello: &skipperv1.Hello{Router: router,
		Subscriptions: []*skipperv1.Subscription{{Function: ref("default", "hello")}, {Function: ref("default", "missing")}}}}}
	report := &skipperv1.RouterMessage{Message: &skipperv1.RouterMessage_Report{Report: &skipperv1.Report{Sequence: 1,
		Functions: []*skipperv1.FunctionReport{{Function: ref("default", "hello"), InFlight: 3, RequestsTotal: 10}}}}}
	ack := &skipperv1.RouterMessage{Message: &skipperv1.RouterMessage_Ack{Ack: &skipperv1.Ack{Function: ref("default", "hello"), Generation: 1}}}
	f.Add(seed(hello, report, ack))
	f.Add(seed(hello, report, report))
	f.Add(seed(report))
	f.Add(seed(&skipperv1.RouterMessage{Message: &skipperv1.RouterMessage_Hello{Hello: &skipperv1.Hello{}}}))
	f.Add([]byte{0x0a, 0x00, 0xff, 0x12, 0x02, 0x08, 0x01})

	client := fuzzServer(f)
	contract := func(t *testing.T, err error) {
		t.Helper()
		if err == nil || err == io.EOF {
			return
		}
		st, ok := status.FromError(err)
		if !ok {
			t.Fatalf("stream ended with %v, not a gRPC status", err)
		}
		switch st.Code() {
		case codes.InvalidArgument, codes.NotFound, codes.FailedPrecondition, codes.ResourceExhausted,
			codes.Unavailable, codes.PermissionDenied, codes.Canceled, codes.DeadlineExceeded:
		default:
			t.Fatalf("stream ended with %v: code %v is not one the contract names", err, st.Code())
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var msgs []*skipperv1.RouterMessage
		for part := range bytes.SplitSeq(data, []byte{0xff}) {
			var m skipperv1.RouterMessage
			if proto.Unmarshal(part, &m) != nil {
				t.Skip("a part is not a RouterMessage")
			}
			msgs = append(msgs, &m)
		}
		if len(msgs) > 64 {
			t.Skip("too many messages")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		stream, err := client.Connect(ctx)
		if err != nil {
			t.Fatalf("connect: %v", err)
		}
		for _, m := range msgs {
			if err := stream.Send(m); err != nil {
				break // the server ended the stream; Recv says why
			}
		}
		if err := stream.CloseSend(); err != nil {
			t.Fatalf("close send: %v", err)
		}
		for {
			if _, err := stream.Recv(); err != nil {
				contract(t, err)
				break
			}
		}
		// The server still serves.
		if _, err := client.GetInstance(ctx, &skipperv1.GetInstanceRequest{Function: ref("default", "missing")}); status.Code(err) != codes.NotFound {
			t.Fatalf("GetInstance after the stream: %v, want NotFound", err)
		}
	})
}
