package controller

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/controller/assign"
	"skipper.dev/skipper/controller/ring"
	"skipper.dev/skipper/internal/poll"
	skipperv1 "skipper.dev/skipper/proto/skipperv1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// klog's flush daemon lives for the process.
		goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
	)
}

const systemNS = "skipper-system"

var podsGVR = corev1.SchemeGroupVersion.WithResource("pods")

// testEnv is a fake cluster plus an httptest server standing in for every
// instance's assign endpoint.
type testEnv struct {
	t    *testing.T
	core *fake.Clientset
	dyn  *dynamicfake.FakeDynamicClient

	assignSrv  *httptest.Server
	assignPort int32

	mu       sync.Mutex
	assigned []assign.Request
	// holds is each instance's assignment by pod UID, as the instance
	// contract has it: one function for its life, 409 for another.
	holds      map[string]string
	holdClaims map[string]string // a oneshot holder's claim id, by pod UID
	failFn     map[string]int    // function key → status to answer
	beforeRV   func(pod *corev1.Pod)
	patchedOK  []string // pods the API server claimed
	requests   []string // "<method> <client address>" of every request to the assign endpoint
	// dropAssigns is how many assigns the instance takes (and holds)
	// and then answers by closing the connection.
	dropAssigns int
	// formats is the instance's assign.HeaderTokenFormats on GET answers;
	// empty: none, as an instance older than the list.
	formats string
}

func newTestEnv(t *testing.T) *testEnv {
	t.Helper()
	e := &testEnv{t: t, failFn: map[string]int{}, holds: map[string]string{}, holdClaims: map[string]string{}}
	e.assignSrv = httptest.NewServer(http.HandlerFunc(e.serveAssign))
	t.Cleanup(e.assignSrv.Close)
	_, port, _ := net.SplitHostPort(e.assignSrv.Listener.Addr().String())
	p, _ := strconv.Atoi(port)
	e.assignPort = int32(p)

	e.core = fake.NewClientset()
	e.core.PrependReactor("patch", "pods", e.patchPod)
	e.dyn = dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{v1alpha1.Resource: "FunctionList"})
	return e
}

func (e *testEnv) serveAssign(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	e.requests = append(e.requests, r.Method+" "+r.RemoteAddr)
	e.mu.Unlock()
	if r.Method == http.MethodGet && r.URL.Path == assign.Path {
		e.mu.Lock()
		held := e.holds[r.URL.Query().Get("pod")]
		if e.formats != "" {
			w.Header().Set(assign.HeaderTokenFormats, e.formats)
		}
		e.mu.Unlock()
		if held == "" {
			http.Error(w, `{"reason":"unassigned"}`, http.StatusNotFound)
			return
		}
		_ = json.NewEncoder(w).Encode(assign.Assignment{Function: held})
		return
	}
	if r.Method != http.MethodPost || r.URL.Path != assign.Path {
		http.Error(w, "wrong endpoint", http.StatusNotFound)
		return
	}
	var req assign.Request
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	uid := tokenAudience(req.Token)
	e.mu.Lock()
	e.assigned = append(e.assigned, req)
	code := e.failFn[req.Function]
	held, heldClaim := e.holds[uid], e.holdClaims[uid]
	if code == 0 && held == "" {
		e.holds[uid] = req.Function
		if req.Oneshot {
			e.holdClaims[uid] = req.Claim
		}
	}
	drop := e.dropAssigns > 0
	if drop {
		e.dropAssigns--
	}
	e.mu.Unlock()
	if drop {
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			_ = conn.Close()
			return
		}
	}
	switch {
	case code != 0:
		http.Error(w, "refused by test", code)
	case held != "" && (held != req.Function || req.Oneshot && heldClaim != req.Claim):
		w.WriteHeader(http.StatusConflict)
		_ = json.NewEncoder(w).Encode(assign.Conflict{Reason: assign.ReasonAlreadyAssigned, Function: held, Error: "instance is assigned to " + held})
	default:
		w.WriteHeader(http.StatusOK)
	}
}

// tokenAudience is the pod UID an assign token names (not verified: the
// tests of the token are assign's).
func tokenAudience(token string) string {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return ""
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return ""
	}
	var c assign.Claims
	_ = json.Unmarshal(b, &c)
	return c.Audience
}

// holdsFunction makes the instance of pod uid hold function key, as if an
// earlier claim had assigned it.
func (e *testEnv) holdsFunction(uid, key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.holds[uid] = key
}

func (e *testEnv) assignRequests() []assign.Request {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]assign.Request(nil), e.assigned...)
}

// patchPod applies JSON patches to pods as the API server does: test ops
// that fail answer 422, and every write bumps resourceVersion.
func (e *testEnv) patchPod(action k8stesting.Action) (bool, runtime.Object, error) {
	pa := action.(k8stesting.PatchAction)
	if pa.GetPatchType() != types.JSONPatchType {
		return false, nil, nil
	}
	tr := e.core.Tracker()
	obj, err := tr.Get(podsGVR, pa.GetNamespace(), pa.GetName())
	if err != nil {
		return true, nil, err
	}
	pod := obj.(*corev1.Pod).DeepCopy()
	e.mu.Lock()
	hook := e.beforeRV
	e.mu.Unlock()
	if hook != nil {
		hook(pod) // a concurrent writer got there first
	}
	js, _ := json.Marshal(pod)
	patch, err := jsonpatch.DecodePatch(pa.GetPatch())
	if err != nil {
		return true, nil, apierrors.NewBadRequest(err.Error())
	}
	out, err := patch.Apply(js)
	if err != nil {
		return true, nil, apierrors.NewGenericServerResponse(http.StatusUnprocessableEntity, "patch",
			podsGVR.GroupResource(), pa.GetName(), err.Error(), 0, false)
	}
	var np corev1.Pod
	if err := json.Unmarshal(out, &np); err != nil {
		return true, nil, err
	}
	rv, _ := strconv.Atoi(np.ResourceVersion)
	np.ResourceVersion = strconv.Itoa(rv + 1)
	if err := tr.Update(podsGVR, &np, np.Namespace); err != nil {
		return true, nil, err
	}
	e.mu.Lock()
	e.patchedOK = append(e.patchedOK, np.Name)
	e.mu.Unlock()
	return true, &np, nil
}

func (e *testEnv) add(objs ...runtime.Object) {
	e.t.Helper()
	ctx := context.Background()
	for _, o := range objs {
		var err error
		switch o := o.(type) {
		case *corev1.Pod:
			_, err = e.core.CoreV1().Pods(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *appsv1.Deployment:
			_, err = e.core.AppsV1().Deployments(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *discoveryv1.EndpointSlice:
			_, err = e.core.DiscoveryV1().EndpointSlices(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *corev1.Secret:
			_, err = e.core.CoreV1().Secrets(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *v1alpha1.Function:
			u, cerr := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
			if cerr != nil {
				e.t.Fatal(cerr)
			}
			us := &unstructured.Unstructured{Object: u}
			us.SetAPIVersion(v1alpha1.SchemeGroupVersion.String())
			us.SetKind("Function")
			_, err = e.dyn.Resource(v1alpha1.Resource).Namespace(o.Namespace).Create(ctx, us, metav1.CreateOptions{})
		default:
			e.t.Fatalf("add: unsupported %T", o)
		}
		if err != nil {
			e.t.Fatalf("add %T: %v", o, err)
		}
	}
}

func (e *testEnv) pod(name string) *corev1.Pod {
	e.t.Helper()
	p, err := e.core.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatalf("get pod %s: %v", name, err)
	}
	return p
}

func (e *testEnv) publicKey() ed25519.PublicKey {
	e.t.Helper()
	s, err := e.core.CoreV1().Secrets(systemNS).Get(context.Background(), assignKeySecret, metav1.GetOptions{})
	if err != nil {
		e.t.Fatalf("get assign key secret: %v", err)
	}
	k, err := assign.ParsePublicKeys(s.Data[assignKeyPublicKey])
	if err != nil {
		e.t.Fatal(err)
	}
	return k[0]
}

// poolDeploy is a pool Deployment for pool in default.
func poolDeploy(pool string) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: pool, Labels: map[string]string{v1alpha1.LabelPool: pool}},
		Spec: appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "main", Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
		}}}}},
	}
}

// fnFor is a Function in default on pool whose instances serve on the
// test's assign server.
func (e *testEnv) fnFor(name, pool string) *v1alpha1.Function {
	fn := testFunction(name)
	fn.Spec.Pool = pool
	fn.Spec.Port = e.assignPort
	fn.Spec.ConcurrencyLimit = 4
	fn.Spec.Config = map[string]string{"greeting": "hi"}
	return fn
}

func poolPod(name, pool string, opts ...podOpt) *corev1.Pod {
	return testPod(name, append([]podOpt{pooled(pool), ip("127.0.0.1")}, opts...)...)
}

// ctlSlice is an EndpointSlice of the controller Service.
func ctlSlice(name string, port int32, addr string) *discoveryv1.EndpointSlice {
	s := slice(name, ptr(port), "grpc", ep(addr, ptr(true), nil))
	s.Namespace = systemNS
	s.Labels = map[string]string{discoveryv1.LabelServiceName: "skipper-controller"}
	s.AddressType = discoveryv1.AddressTypeIPv4
	return s
}

// sliceOf is the controller Service's EndpointSlice for a replica
// listening on l.
func sliceOf(name string, l net.Listener) *discoveryv1.EndpointSlice {
	h, p, _ := net.SplitHostPort(l.Addr().String())
	n, _ := strconv.Atoi(p)
	return ctlSlice(name, int32(n), h)
}

// functionOwnedBy returns a function name that the ring of members' addresses
// gives to owner.
func functionOwnedBy(t *testing.T, owner net.Listener, members ...net.Listener) string {
	t.Helper()
	var addrs []string
	for _, m := range members {
		addrs = append(addrs, m.Addr().String())
	}
	rg, err := ring.New(addrs)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1000 {
		if n := fmt.Sprintf("fn-%d", i); rg.Owner("default/"+n) == owner.Addr().String() {
			return n
		}
	}
	t.Fatal("no function name the ring gives to the owner")
	return ""
}

// forwardingPair starts replicas ctl-a and ctl-b, each configured by
// configure (nil: the defaults), and a function B owns on pool echo (one
// pod, p1); once both see the two-member ring it returns A and the
// function's name: A forwards the function's calls to B.
func forwardingPair(t *testing.T, e *testEnv, configure func(*Config)) (a *replica, name string) {
	t.Helper()
	la, lb := listen(t), listen(t)
	// Both replicas share 127.0.0.1, so each advertises its own port; the
	// Service's slices carry one port each (one slice per port, as the
	// EndpointSlice controller writes for distinct target ports).
	e.add(sliceOf("ctl-a", la), sliceOf("ctl-b", lb))
	name = functionOwnedBy(t, lb, la, lb)
	e.add(poolDeploy("echo"), e.fnFor(name, "echo"), poolPod("p1", "echo"))
	a = startReplica(t, e, "ctl-a", la, configure)
	b := startReplica(t, e, "ctl-b", lb, configure)
	poll.Until(t, pollTimeout, pollInterval, "both replicas see a two-member ring", func(context.Context) error { return ringMembers(t, 2, a, b) })
	return a, name
}

// replica is one controller replica serving on loopback.
type replica struct {
	name     string
	addr     string
	httpAddr string
	client   skipperv1.ControllerClient
	conn     *grpc.ClientConn
	stop     func() // cancels the replica's context and waits for serve to return
}

func startReplica(t *testing.T, e *testEnv, name string, grpcLis net.Listener, modify func(*Config)) *replica {
	t.Helper()
	if grpcLis == nil {
		grpcLis = listen(t)
	}
	httpLis := listen(t)
	cfg := validConfig()
	cfg.PodName, cfg.PodNamespace, cfg.PodIP = name, systemNS, "127.0.0.1"
	cfg.ClaimTimeout, cfg.AssignTimeout, cfg.ShutdownTimeout = 2*time.Second, 2*time.Second, 2*time.Second
	if modify != nil {
		modify(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, cfg, log, clients{core: e.core, dyn: e.dyn}, grpcLis, httpLis) }()
	r := &replica{name: name, addr: grpcLis.Addr().String(), httpAddr: httpLis.Addr().String()}
	conn, err := grpc.NewClient("passthrough:///"+r.addr, grpc.WithTransportCredentials(testTransport(t, cfg)))
	if err != nil {
		t.Fatal(err)
	}
	r.conn, r.client = conn, skipperv1.NewControllerClient(conn)
	var once sync.Once
	r.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("serve: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Error("serve did not return within 10s of cancellation")
			}
		})
	}
	t.Cleanup(func() {
		conn.Close()
		r.stop()
	})
	poll.Until(t, pollTimeout, pollInterval, "replica ready", func(context.Context) error {
		if code := httpGet(t, r.httpAddr, "/readyz"); code != http.StatusOK {
			return fmt.Errorf("/readyz: %d", code)
		}
		return nil
	})
	return r
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func httpGet(t *testing.T, addr, path string) int {
	t.Helper()
	code, _ := httpGetBody(t, addr, path)
	return code
}

func httpGetBody(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// pollTimeout and pollInterval are this package's poll.Until defaults.
const pollTimeout, pollInterval = 5 * time.Second, 10 * time.Millisecond

// diff is cmp.Diff as an error, for a poll.Until condition.
func diff(want, got any) error {
	if d := cmp.Diff(want, got); d != "" {
		return fmt.Errorf("(-want +got):\n%s", d)
	}
	return nil
}

// metricLines says whether r's metrics have each of the sample lines, as
// a poll.Until condition.
func metricLines(t *testing.T, r *replica, lines ...string) error {
	t.Helper()
	_, body := httpGetBody(t, r.httpAddr, "/metrics")
	for _, l := range lines {
		if !strings.Contains(body, l) {
			return fmt.Errorf("no %s", l)
		}
	}
	return nil
}

// ringMembers says whether every replica's metrics show a ring of n
// members, as a poll.Until condition.
func ringMembers(t *testing.T, n int, rs ...*replica) error {
	t.Helper()
	for _, r := range rs {
		_, body := httpGetBody(t, r.httpAddr, "/metrics")
		if !strings.Contains(body, fmt.Sprintf("\nskipper_controller_ring_members %d\n", n)) {
			return fmt.Errorf("%s: no skipper_controller_ring_members %d", r.httpAddr, n)
		}
	}
	return nil
}

// podGone says whether pod name is gone, as a poll.Until condition.
func podGone(ctx context.Context, e *testEnv, name string) error {
	if _, err := e.core.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		return fmt.Errorf("get pod %s: %v, want NotFound", name, err)
	}
	return nil
}

// recordedFor says whether p carries fn's record (label and
// ownerReference), as a poll.Until condition.
func recordedFor(p *corev1.Pod, fn *v1alpha1.Function) error {
	if p.Labels[v1alpha1.LabelFunction] != fn.Name || !ownedBy(p, fn) {
		return fmt.Errorf("%s labelled %q, owned by %v: not recorded for %s", p.Name, p.Labels[v1alpha1.LabelFunction], p.OwnerReferences, fn.Name)
	}
	return nil
}

func getInstance(ctx context.Context, r *replica, name string, router *skipperv1.RouterIdentity) (*skipperv1.GetInstanceResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return r.client.GetInstance(ctx, &skipperv1.GetInstanceRequest{
		Function: &skipperv1.FunctionRef{Namespace: "default", Name: name},
		Router:   router,
	})
}

func TestGetInstanceClaimsAndAssigns(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	fn := e.fnFor("hello", "echo")
	fn.Spec.MaxBodyBytes = 1 << 30
	e.add(poolDeploy("echo"), fn, poolPod("p1", "echo"), poolPod("p2", "echo", readyAt(t0.Add(time.Minute))))
	r := startReplica(t, e, "ctl-0", nil, nil)

	resp, err := getInstance(t.Context(), r, "hello", nil)
	if err != nil {
		t.Fatalf("GetInstance: %v", err)
	}
	// p1 has been Ready longest, so it is claimed.
	wantInst := []*skipperv1.Instance{{Pod: "p1", PodUid: "uid-p1", Address: fmt.Sprintf("127.0.0.1:%d", e.assignPort), Node: "node-1"}}
	if got := resp.GetInstances(); len(got) != 1 || got[0].GetPod() != "p1" || got[0].GetAddress() != wantInst[0].Address ||
		got[0].GetPodUid() != "uid-p1" || got[0].GetNode() != "node-1" {
		t.Fatalf("instances = %v, want %v", got, wantInst)
	}
	if resp.GetOwner() != "ctl-0" || resp.GetGeneration() == 0 {
		t.Errorf("owner %q generation %d, want ctl-0 and non-zero", resp.GetOwner(), resp.GetGeneration())
	}
	if c := resp.GetConfig(); c.GetConcurrencyLimit() != 4 || c.GetOneshot() || c.GetTimeout() != nil || c.GetMaxBodyBytes() != 1<<30 {
		t.Errorf("config = %v, want concurrency 4, no timeout, max body 1 GiB", c)
	}

	// The pod carries the claim once its record landed.
	poll.Until(t, pollTimeout, pollInterval, "p1's record", func(context.Context) error {
		if e.pod("p1").Labels[v1alpha1.LabelFunction] == "" {
			return errors.New("p1 not labelled")
		}
		return nil
	})
	p1 := e.pod("p1")
	if p1.Labels[v1alpha1.LabelFunction] != "hello" || !ownedBy(p1, fn) {
		t.Errorf("p1 labels %v owners %v: not claimed for hello", p1.Labels, p1.OwnerReferences)
	}
	if len(p1.OwnerReferences) != 2 || p1.OwnerReferences[0].Kind != "ReplicaSet" {
		t.Errorf("the ReplicaSet ownerReference was not kept: %v", p1.OwnerReferences)
	}
	if _, claimed := e.pod("p2").Labels[v1alpha1.LabelFunction]; claimed {
		t.Error("p2 was claimed too")
	}

	// The instance got a verifiable assignment.
	reqs := e.assignRequests()
	if len(reqs) != 1 {
		t.Fatalf("%d assign requests, want 1", len(reqs))
	}
	// As the instance checks it: the request that crossed the wire is the
	// one the token was signed for.
	claims, err := assign.VerifyRequest([]ed25519.PublicKey{e.publicKey()}, reqs[0], "uid-p1", time.Now())
	if err != nil {
		t.Fatalf("assign token: %v", err)
	}
	if claims.Function != "default/hello" || reqs[0].Function != "default/hello" || reqs[0].Port != e.assignPort ||
		reqs[0].Config["greeting"] != "hi" {
		t.Errorf("assign request %+v claims %+v", reqs[0], claims)
	}
	if exp := time.Unix(claims.Expiry, 0); exp.Before(time.Now()) || exp.After(time.Now().Add(2*time.Minute)) {
		t.Errorf("token expiry %s, want about a minute ahead", exp)
	}

	// A second call is served from the set: same generation, no claim.
	again, err := getInstance(t.Context(), r, "hello", nil)
	if err != nil {
		t.Fatal(err)
	}
	if again.GetGeneration() != resp.GetGeneration() || len(again.GetInstances()) != 1 {
		t.Errorf("second call: generation %d (first %d), instances %v", again.GetGeneration(), resp.GetGeneration(), again.GetInstances())
	}
	if n := len(e.assignRequests()); n != 1 {
		t.Errorf("%d assign requests after the second call, want 1", n)
	}

	// The public key is published where pool pods mount it, and status names the owner.
	poll.Until(t, pollTimeout, pollInterval, "assign key ConfigMap in default", func(ctx context.Context) error {
		cm, err := e.core.CoreV1().ConfigMaps("default").Get(ctx, v1alpha1.AssignKeyConfigMap, metav1.GetOptions{})
		if err != nil {
			return err
		}
		k, err := assign.ParsePublicKeys([]byte(cm.Data[v1alpha1.AssignKeyConfigMapKey]))
		if err != nil || len(k) != 1 || !k[0].Equal(e.publicKey()) {
			return fmt.Errorf("keys %v (%v), want the test key alone", k, err)
		}
		return nil
	})
	poll.Until(t, pollTimeout, pollInterval, "status.owner", func(ctx context.Context) error {
		u, err := e.dyn.Resource(v1alpha1.Resource).Namespace("default").Get(ctx, "hello", metav1.GetOptions{})
		if err != nil {
			return err
		}
		owner, _, _ := unstructured.NestedString(u.Object, "status", "owner")
		ready, _, _ := unstructured.NestedInt64(u.Object, "status", "ready")
		if owner != "ctl-0" || ready != 1 {
			return fmt.Errorf("owner %q ready %d, want ctl-0 and 1", owner, ready)
		}
		return nil
	})
	_, metrics := httpGetBody(t, r.httpAddr, "/metrics")
	for _, want := range []string{
		`skipper_controller_assignments_total{function="default/hello",result="claimed"} 1`,
		`skipper_controller_assignments_total{function="default/hello",result="existing"} 1`,
		`skipper_controller_assignments_total{function="default/hello",result="exhausted"} 0`,
		`skipper_controller_assignment_seconds_count 2`,
		`skipper_controller_owned_functions 1`,
		`skipper_controller_ring_members 0`,
		`skipper_controller_instances{function="default/hello",state="ready"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

func TestConcurrentCallersShareOneClaim(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	e.add(poolDeploy("echo"), e.fnFor("hello", "echo"), poolPod("p1", "echo"), poolPod("p2", "echo"), poolPod("p3", "echo"))
	r := startReplica(t, e, "ctl-0", nil, nil)

	const callers = 20
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	pods := make(chan string, callers)
	for range callers {
		wg.Go(func() {
			resp, err := getInstance(t.Context(), r, "hello", nil)
			if err != nil {
				errs <- err
				return
			}
			pods <- resp.GetInstances()[0].GetPod()
		})
	}
	wg.Wait()
	close(errs)
	close(pods)
	for err := range errs {
		t.Errorf("GetInstance: %v", err)
	}
	seen := map[string]bool{}
	for p := range pods {
		seen[p] = true
	}
	if len(seen) != 1 {
		t.Errorf("callers got pods %v, want one pod for all", seen)
	}
	if n := len(e.assignRequests()); n != 1 {
		t.Errorf("%d assign requests, want 1", n)
	}
	countClaimed := func() int {
		claimed := 0
		for _, n := range []string{"p1", "p2", "p3"} {
			if _, ok := e.pod(n).Labels[v1alpha1.LabelFunction]; ok {
				claimed++
			}
		}
		return claimed
	}
	poll.Until(t, pollTimeout, pollInterval, "the claim recorded", func(context.Context) error {
		if countClaimed() < 1 {
			return errors.New("no pod labelled")
		}
		return nil
	})
	claimed := 0
	for _, n := range []string{"p1", "p2", "p3"} {
		if _, ok := e.pod(n).Labels[v1alpha1.LabelFunction]; ok {
			claimed++
		}
	}
	if claimed != 1 {
		t.Errorf("%d pods claimed, want 1", claimed)
	}
}

// TestClaimConflictMovesToNextPod: an instance that holds another function
// (a claim by another replica, or one never recorded) answers 409: the
// claim moves to the next pod, and the pod is recorded for the function
// its instance holds (adopted).
func TestClaimConflictMovesToNextPod(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	other := e.fnFor("other", "echo")
	e.add(poolDeploy("echo"), e.fnFor("hello", "echo"), other, poolPod("p1", "echo"), poolPod("p2", "echo", readyAt(t0.Add(time.Second))))
	e.holdsFunction("uid-p1", "default/other")
	r := startReplica(t, e, "ctl-0", nil, nil)

	resp, err := getInstance(t.Context(), r, "hello", nil)
	if err != nil {
		t.Fatalf("GetInstance: %v", err)
	}
	if got := resp.GetInstances()[0].GetPod(); got != "p2" {
		t.Errorf("claimed %s, want p2 after p1's instance answered 409", got)
	}
	poll.Until(t, pollTimeout, pollInterval, "p1 recorded for the function its instance holds", func(context.Context) error {
		return recordedFor(e.pod("p1"), other)
	})
	poll.Until(t, pollTimeout, pollInterval, "p2 recorded for hello", func(context.Context) error {
		if l := e.pod("p2").Labels[v1alpha1.LabelFunction]; l != "hello" {
			return fmt.Errorf("p2 labelled %q", l)
		}
		return nil
	})
}

// TestClaimAnsweredBeforeItsRecord: the instance's acceptance is the claim.
// GetInstance answers while every pod write fails (an API server down);
// the record lands once writes succeed again, and until then the claim is
// counted as unrecorded.
func TestClaimAnsweredBeforeItsRecord(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	var down atomic.Bool
	down.Store(true)
	e.core.PrependReactor("patch", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		if down.Load() {
			return true, nil, apierrors.NewServiceUnavailable("API server down (test)")
		}
		return false, nil, nil
	})
	fn := e.fnFor("hello", "echo")
	e.add(poolDeploy("echo"), fn, poolPod("p1", "echo"))
	r := startReplica(t, e, "ctl-0", nil, nil)

	resp, err := getInstance(t.Context(), r, "hello", nil)
	if err != nil {
		t.Fatalf("GetInstance with pod writes failing: %v", err)
	}
	if got := resp.GetInstances(); len(got) != 1 || got[0].GetPod() != "p1" {
		t.Fatalf("instances %v, want p1", got)
	}
	if _, ok := e.pod("p1").Labels[v1alpha1.LabelFunction]; ok {
		t.Fatal("p1 labelled while every pod write fails")
	}
	unrecorded := func(n int) bool {
		_, body := httpGetBody(t, r.httpAddr, "/metrics")
		return strings.Contains(body, fmt.Sprintf("skipper_controller_claims_unrecorded %d\n", n))
	}
	if !unrecorded(1) {
		t.Error("skipper_controller_claims_unrecorded is not 1 while the record cannot land")
	}
	// A second call is answered from the assumed claim: no second claim.
	if resp, err := getInstance(t.Context(), r, "hello", nil); err != nil || resp.GetInstances()[0].GetPod() != "p1" {
		t.Fatalf("second GetInstance = %v, %v; want p1", resp, err)
	}
	down.Store(false)
	poll.Until(t, pollTimeout, pollInterval, "the record landed", func(context.Context) error {
		if err := recordedFor(e.pod("p1"), fn); err != nil {
			return err
		}
		if !unrecorded(0) {
			return errors.New("skipper_controller_claims_unrecorded is not 0")
		}
		return nil
	})
	if n := len(e.assignRequests()); n != 1 {
		t.Errorf("%d assign requests, want 1", n)
	}
}

func TestGetInstanceWaitsForAPoolPod(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	e.add(poolDeploy("echo"), e.fnFor("hello", "echo"))
	r := startReplica(t, e, "ctl-0", nil, nil)
	time.AfterFunc(200*time.Millisecond, func() {
		_, _ = e.core.CoreV1().Pods("default").Create(context.Background(), poolPod("late", "echo"), metav1.CreateOptions{})
	})
	resp, err := getInstance(t.Context(), r, "hello", nil)
	if err != nil {
		t.Fatalf("GetInstance: %v", err)
	}
	if got := resp.GetInstances()[0].GetPod(); got != "late" {
		t.Errorf("instance %s, want late", got)
	}
}

func TestGetInstanceErrors(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	e.add(
		poolDeploy("echo"), poolDeploy("empty"), poolPod("p1", "echo"),
		e.fnFor("hello", "echo"), e.fnFor("nopool", "missing"), e.fnFor("starved", "empty"), e.fnFor("broken", "echo"),
	)
	oneshot := e.fnFor("once", "echo")
	oneshot.Spec.Oneshot = true
	e.add(oneshot)
	e.failFn["default/broken"] = http.StatusInternalServerError
	r := startReplica(t, e, "ctl-0", nil, func(c *Config) { c.ClaimTimeout = 300 * time.Millisecond })

	tests := []struct {
		name     string
		ns, fn   string
		want     codes.Code
		wantMsg  string
		deadline time.Duration
	}{
		{name: "empty name", ns: "default", fn: "", want: codes.InvalidArgument, wantMsg: "name is empty"},
		{name: "bad namespace", ns: "Not_A_Namespace", fn: "hello", want: codes.InvalidArgument, wantMsg: "namespace"},
		{name: "unknown function", ns: "default", fn: "nope", want: codes.NotFound, wantMsg: "function default/nope not found"},
		{name: "pool missing", ns: "default", fn: "nopool", want: codes.FailedPrecondition, wantMsg: "pool default/missing of function default/nopool not found"},
		{name: "pool empty", ns: "default", fn: "starved", want: codes.ResourceExhausted, wantMsg: "pool default/empty has no ready pods"},
		{name: "pool empty, caller deadline first", ns: "default", fn: "starved", want: codes.DeadlineExceeded, deadline: 50 * time.Millisecond},
		{name: "oneshot without a router identity", ns: "default", fn: "once", want: codes.InvalidArgument, wantMsg: "needs router.pod"},
		{name: "assign refused", ns: "default", fn: "broken", want: codes.Unavailable, wantMsg: "500"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := t.Context()
			if tt.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.deadline)
				defer cancel()
			}
			_, err := r.client.GetInstance(ctx, &skipperv1.GetInstanceRequest{Function: &skipperv1.FunctionRef{Namespace: tt.ns, Name: tt.fn}})
			st := status.Convert(err)
			if st.Code() != tt.want || !strings.Contains(st.Message(), tt.wantMsg) {
				t.Errorf("GetInstance = %v %q, want %v containing %q", st.Code(), st.Message(), tt.want, tt.wantMsg)
			}
		})
	}
	// The pod whose assignment failed was claimed, so the pool let it go:
	// it is deleted rather than left orphaned.
	if _, err := e.core.CoreV1().Pods("default").Get(t.Context(), "p1", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("pod p1 after a failed assignment: err = %v, want NotFound", err)
	}
	_, err := r.client.ReleaseInstance(t.Context(), &skipperv1.ReleaseInstanceRequest{})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("ReleaseInstance = %v, want InvalidArgument", err)
	}
}

func TestForwardsOnceToOwner(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	a, name := forwardingPair(t, e, nil)

	resp, err := getInstance(t.Context(), a, name, nil)
	if err != nil {
		t.Fatalf("GetInstance via A: %v", err)
	}
	if resp.GetOwner() != "ctl-b" {
		t.Errorf("owner = %q, want ctl-b (forwarded)", resp.GetOwner())
	}
	// A forwarded request is answered where it lands, never forwarded again.
	fwd, err := a.client.GetInstance(t.Context(), &skipperv1.GetInstanceRequest{
		Function: &skipperv1.FunctionRef{Namespace: "default", Name: name}, Forwarded: true,
	})
	if err != nil {
		t.Fatalf("forwarded GetInstance on A: %v", err)
	}
	if fwd.GetOwner() != "ctl-a" {
		t.Errorf("owner of a forwarded request = %q, want ctl-a", fwd.GetOwner())
	}
	_, ma := httpGetBody(t, a.httpAddr, "/metrics")
	if want := fmt.Sprintf(`skipper_controller_assignments_total{function="default/%s",result="forwarded"} 1`, name); !strings.Contains(ma, want) {
		t.Errorf("A's metrics lack %q", want)
	}
}

// helloStream opens a Connect stream to r as router id and returns it
// with r's Welcome (nil if the first message was something else). It ends
// with ctx.
func helloStream(t *testing.T, ctx context.Context, r *replica, id *skipperv1.RouterIdentity) (grpc.BidiStreamingClient[skipperv1.RouterMessage, skipperv1.ControllerMessage], *skipperv1.Welcome) {
	t.Helper()
	stream, err := r.client.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&skipperv1.RouterMessage{Message: &skipperv1.RouterMessage_Hello{Hello: &skipperv1.Hello{Router: id}}}); err != nil {
		t.Fatal(err)
	}
	m, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	return stream, m.GetWelcome()
}

func TestConnectPushesUpdates(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	e.add(poolDeploy("echo"), e.fnFor("hello", "echo"), poolPod("p1", "echo"))
	r := startReplica(t, e, "ctl-0", nil, func(c *Config) { c.ReportInterval = 2 * time.Second })

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	id := &skipperv1.RouterIdentity{Node: "node-1", Pod: "skipper-system/router-x", Incarnation: "i1", ProtocolVersion: skipperv1.ProtocolVersion_PROTOCOL_VERSION_1}
	stream, w := helloStream(t, ctx, r, id)
	if w.GetController() != "ctl-0" || w.GetReportInterval().AsDuration() != 2*time.Second || w.GetProtocolVersion() != skipperv1.ProtocolVersion_PROTOCOL_VERSION_1 {
		t.Fatalf("welcome = %v", w)
	}
	if err := stream.Send(&skipperv1.RouterMessage{Message: &skipperv1.RouterMessage_Report{Report: &skipperv1.Report{Sequence: 1}}}); err != nil {
		t.Fatal(err)
	}
	resp, err := getInstance(t.Context(), r, "hello", id)
	if err != nil {
		t.Fatal(err)
	}
	// The claim may reach the stream as an update of its own; read until the
	// instance set empties after the pod stops being Ready.
	p1 := e.pod("p1")
	p1.Status.Conditions[0].Status = corev1.ConditionFalse
	if _, err := e.core.CoreV1().Pods("default").UpdateStatus(t.Context(), p1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := stream.Recv()
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		u := m.GetUpdate()
		if u == nil {
			t.Fatalf("unexpected message %v", m)
		}
		if len(u.GetInstances()) == 0 {
			if u.GetGeneration() <= resp.GetGeneration() {
				t.Errorf("update generation %d not above %d", u.GetGeneration(), resp.GetGeneration())
			}
			if u.GetFunction().GetName() != "hello" || u.GetRemoved() {
				t.Errorf("update = %v", u)
			}
			break
		}
	}
	poll.Until(t, pollTimeout, pollInterval, "heartbeat metric", func(context.Context) error {
		return metricLines(t, r, `skipper_controller_heartbeat_batches_total{node="node-1"} 1`)
	})
	st, err := r.client.GetState(t.Context(), &skipperv1.GetStateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetController() != "ctl-0" || len(st.GetRouters()) != 1 || st.GetRouters()[0].GetLastSequence() != 1 || len(st.GetFunctions()) != 1 {
		t.Errorf("GetState = %v", st)
	}
	// A second stream of the same router process replaces the first.
	_ = stream.CloseSend()
}

func TestHealth(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	r := startReplica(t, e, "ctl-0", nil, nil)
	if code := httpGet(t, r.httpAddr, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d", code)
	}
	for _, svc := range []string{"", "skipper.v1.Controller"} {
		resp, err := healthpb.NewHealthClient(r.conn).Check(t.Context(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health %q = %v, %v; want SERVING", svc, resp.GetStatus(), err)
		}
	}
}

func TestAssignKeyCreateRace(t *testing.T) {
	t.Parallel()
	// Another replica creates the Secret between our Get and our Create.
	other, _ := testKey(t)
	core := fake.NewClientset()
	core.PrependReactor("create", "secrets", func(action k8stesting.Action) (bool, runtime.Object, error) {
		_ = core.Tracker().Add(other)
		return true, nil, apierrors.NewAlreadyExists(corev1.Resource("secrets"), assignKeySecret)
	})
	got, err := loadOrCreateAssignKey(t.Context(), core, systemNS)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := keyFromSecret(other)
	if !got.sign.Equal(want.sign) {
		t.Error("did not adopt the winning replica's key")
	}
	// And an existing Secret is used as is.
	again, err := loadOrCreateAssignKey(t.Context(), core, systemNS)
	if err != nil || !again.sign.Equal(want.sign) {
		t.Errorf("second load: %v, equal %v", err, again.sign.Equal(want.sign))
	}
}

// TestAssignKeyWaitsForTheAPIServer: a replica starting while the API
// server refuses waits for the key (backing off) instead of exiting into
// the kubelet's crash-loop back-off; a Secret that does not parse ends the
// wait at once; a stop ends it with the last failure.
func TestAssignKeyWaitsForTheAPIServer(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	synctest.Test(t, func(t *testing.T) {
		secret, priv := testKey(t)
		core := fake.NewClientset(secret)
		var gets atomic.Int32
		core.PrependReactor("get", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
			if gets.Add(1) <= 3 {
				return true, nil, errors.New("dial tcp 198.19.0.1:443: connect: connection refused")
			}
			return false, nil, nil
		})
		start := time.Now()
		key, err := waitAssignKey(t.Context(), core, systemNS, log)
		if err != nil || !key.sign.Equal(priv) {
			t.Fatalf("waitAssignKey = equal %v, %v; want the Secret's key", key.sign.Equal(priv), err)
		}
		// Three refusals: 250 ms, 500 ms, 1 s of back-off.
		if waited, want := time.Since(start), 1750*time.Millisecond; gets.Load() != 4 || waited != want {
			t.Errorf("%d reads over %s; want 4 over %s", gets.Load(), waited, want)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		bad := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: systemNS, Name: assignKeySecret},
			Data: map[string][]byte{assignKeyPrivateKey: []byte("not PEM")}}
		_, err := waitAssignKey(t.Context(), fake.NewClientset(bad), systemNS, log)
		if !errors.Is(err, errBadKeySecret) {
			t.Errorf("unusable Secret: %v; want errBadKeySecret at once", err)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		core := fake.NewClientset()
		core.PrependReactor("*", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewServiceUnavailable("starting")
		})
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		_, err := waitAssignKey(ctx, core, systemNS, log)
		if !errors.Is(err, context.DeadlineExceeded) || !apierrors.IsServiceUnavailable(err) {
			t.Errorf("stopped wait: %v; want the deadline and the last failure", err)
		}
	})
}

func testKey(t *testing.T) (*corev1.Secret, ed25519.PrivateKey) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	privPEM, _ := assign.MarshalPrivateKey(priv)
	pubPEM, _ := assign.MarshalPublicKey(priv.Public().(ed25519.PublicKey))
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: systemNS, Name: assignKeySecret},
		Data:       map[string][]byte{assignKeyPrivateKey: privPEM, assignKeyPublicKey: pubPEM},
	}, priv
}

func TestHelloResubscriptionGetsCurrentSet(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	e.add(poolDeploy("echo"), e.fnFor("hello", "echo"), poolPod("p1", "echo"))
	r := startReplica(t, e, "ctl-0", nil, nil)
	first, err := getInstance(t.Context(), r, "hello", nil)
	if err != nil {
		t.Fatal(err)
	}
	// A router that reconnects holding an older generation is sent the
	// current set at once.
	stream, err := r.client.Connect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&skipperv1.RouterMessage{Message: &skipperv1.RouterMessage_Hello{Hello: &skipperv1.Hello{
		Router: &skipperv1.RouterIdentity{Node: "node-1", Pod: "skipper-system/router-y", Incarnation: "1"},
		Subscriptions: []*skipperv1.Subscription{{
			Function: &skipperv1.FunctionRef{Namespace: "default", Name: "hello"}, Generation: first.GetGeneration() - 1,
		}},
	}}}); err != nil {
		t.Fatal(err)
	}
	if m, err := stream.Recv(); err != nil || m.GetWelcome() == nil {
		t.Fatalf("first message %v, %v; want Welcome", m, err)
	}
	m, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	u := m.GetUpdate()
	if u.GetGeneration() != first.GetGeneration() || len(u.GetInstances()) != 1 || u.GetInstances()[0].GetPod() != "p1" {
		t.Errorf("update = %v, want generation %d with p1", u, first.GetGeneration())
	}

	// Shutdown ends open streams at once rather than waiting out
	// --shutdown-timeout, telling the router to go elsewhere.
	start := time.Now()
	r.stop()
	if took := time.Since(start); took > time.Second {
		t.Errorf("shutdown with an open stream took %s", took)
	}
	for {
		_, err := stream.Recv()
		if err == nil {
			continue
		}
		if status.Code(err) != codes.Unavailable {
			t.Errorf("stream ended with %v, want Unavailable", err)
		}
		break
	}
}

func TestConnectRequiresHello(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	r := startReplica(t, e, "ctl-0", nil, nil)
	stream, err := r.client.Connect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&skipperv1.RouterMessage{Message: &skipperv1.RouterMessage_Report{Report: &skipperv1.Report{}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Errorf("Recv = %v, want InvalidArgument", err)
	}
}

func TestWaitingClaimTakesAnInstanceClaimedElsewhere(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	fn := e.fnFor("hello", "echo")
	e.add(poolDeploy("echo"), fn)
	r := startReplica(t, e, "ctl-0", nil, nil)
	// Another replica (answering a forwarded call) claims for the same
	// function while this one waits on the empty pool.
	time.AfterFunc(200*time.Millisecond, func() {
		_, _ = e.core.CoreV1().Pods("default").Create(context.Background(), poolPod("elsewhere", "echo", claimedBy(fn)), metav1.CreateOptions{})
	})
	resp, err := getInstance(t.Context(), r, "hello", nil)
	if err != nil {
		t.Fatalf("GetInstance: %v", err)
	}
	if got := resp.GetInstances(); len(got) != 1 || got[0].GetPod() != "elsewhere" {
		t.Errorf("instances = %v, want the pod claimed elsewhere", got)
	}
	if n := len(e.assignRequests()); n != 0 {
		t.Errorf("%d assign requests, want none", n)
	}
}

// An ownership move never withdraws a function from routers: the old owner
// stops pushing, and the new owner subscribes routers from their reports
// and sends them its current set, so warm traffic needs no GetInstance.
func TestOwnershipMoveKeepsRoutersSubscribed(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	la, lb := listen(t), listen(t)
	name := functionOwnedBy(t, lb, la, lb)
	// A alone in the ring owns everything.
	e.add(sliceOf("ctl-a", la), poolDeploy("echo"), e.fnFor(name, "echo"), poolPod("p1", "echo"))
	a := startReplica(t, e, "ctl-a", la, nil)
	b := startReplica(t, e, "ctl-b", lb, nil)
	id := &skipperv1.RouterIdentity{Node: "node-1", Pod: "skipper-system/router-m", Incarnation: "i1"}
	connect := func(r *replica) (skipperv1.Controller_ConnectClient, context.CancelFunc) {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		st, w := helloStream(t, ctx, r, id)
		if w == nil {
			t.Fatal("the first message is not a Welcome")
		}
		return st, cancel
	}
	sa, cancelA := connect(a)
	first, err := getInstance(t.Context(), a, name, id)
	if err != nil || first.GetOwner() != "ctl-a" {
		t.Fatalf("GetInstance on A = %v, %v; want owner ctl-a", first, err)
	}

	// B joins once A's claim is recorded (until then only A knows p1 is
	// the function's: a move inside that window hands B an empty set); the
	// function moves to B.
	poll.Until(t, pollTimeout, pollInterval, "p1's record", func(context.Context) error {
		if l := e.pod("p1").Labels[v1alpha1.LabelFunction]; l != name {
			return fmt.Errorf("p1 labelled %q", l)
		}
		return nil
	})
	e.add(sliceOf("ctl-b", lb))
	poll.Until(t, pollTimeout, pollInterval, "A has forgotten the function", func(ctx context.Context) error {
		st, err := a.client.GetState(ctx, &skipperv1.GetStateRequest{})
		if err != nil {
			return err
		}
		if len(st.GetRingMembers()) != 2 || len(st.GetFunctions()) != 0 {
			return fmt.Errorf("ring %v, functions %v", st.GetRingMembers(), st.GetFunctions())
		}
		return nil
	})
	// B's own view too: a report B takes before its ring names it the
	// owner subscribes nothing (the router's next report would; this test
	// sends one). CI once sent it 1 ms before B's ring changed.
	poll.Until(t, pollTimeout, pollInterval, "B sees itself in the ring", func(ctx context.Context) error {
		st, err := b.client.GetState(ctx, &skipperv1.GetStateRequest{})
		if err != nil {
			return err
		}
		if len(st.GetRingMembers()) != 2 {
			return fmt.Errorf("ring %v", st.GetRingMembers())
		}
		return nil
	})
	sb, cancelB := connect(b)
	defer cancelB()
	if err := sb.Send(&skipperv1.RouterMessage{Message: &skipperv1.RouterMessage_Report{Report: &skipperv1.Report{
		Sequence: 1,
		Functions: []*skipperv1.FunctionReport{{
			Function: &skipperv1.FunctionRef{Namespace: "default", Name: name}, Generation: first.GetGeneration(),
		}},
	}}}); err != nil {
		t.Fatal(err)
	}
	m, err := sb.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if u := m.GetUpdate(); u.GetRemoved() || u.GetGeneration() <= first.GetGeneration() ||
		len(u.GetInstances()) != 1 || u.GetInstances()[0].GetPod() != "p1" {
		t.Errorf("B's update = %v; want p1 at a generation above %d", m, first.GetGeneration())
	}

	// Nothing A sent after the GetInstance withdrew the function.
	cancelA()
	for {
		m, err := sa.Recv()
		if err != nil {
			break
		}
		if u := m.GetUpdate(); u.GetRemoved() || len(u.GetInstances()) == 0 {
			t.Errorf("old owner pushed %v after the ownership move", m)
		}
	}
}

// TestUnrecordedOneshotAdoptedAfterTheGrace: a oneshot instance another
// claim of the same function won (409 naming it) whose record never came
// (its controller died) is adopted once no claim can still record it, so
// it leaves the pool instead of answering 409 for good.
func TestUnrecordedOneshotAdoptedAfterTheGrace(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	once := e.fnFor("once", "echo")
	once.Spec.Oneshot = true
	e.add(poolDeploy("echo"), once, poolPod("p1", "echo"), poolPod("p2", "echo", readyAt(t0.Add(time.Second))))
	e.holdsFunction("uid-p1", "default/once")
	e.mu.Lock()
	e.holdClaims["uid-p1"] = "a claim of a dead controller"
	e.mu.Unlock()
	// The grace is ClaimTimeout + 2 AssignTimeout (2s): room for the claim
	// of p2 and the check below on a loaded machine.
	r := startReplica(t, e, "ctl-0", nil, func(c *Config) { c.ClaimTimeout, c.AssignTimeout = time.Second, 500*time.Millisecond })
	router := &skipperv1.RouterIdentity{Node: "node-1", Pod: "skipper-system/router-a", Incarnation: "i1"}
	resp, err := getInstance(t.Context(), r, "once", router)
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetInstance().GetPod(); got != "p2" {
		t.Fatalf("oneshot instance %s, want p2 (p1 holds another claim's call)", got)
	}
	if _, ok := e.pod("p1").Labels[v1alpha1.LabelFunction]; ok {
		t.Fatal("p1 recorded at once: the claim that won it may still record it")
	}
	poll.Until(t, pollTimeout, pollInterval, "p1 adopted after the grace", func(context.Context) error {
		p := e.pod("p1")
		if err := recordedFor(p, once); err != nil {
			return err
		}
		if r := p.Annotations[annOneshotRouter]; r != "" {
			return fmt.Errorf("p1 still leased to router %s", r)
		}
		return nil
	})
}

// TestClaimPassesOverAnUnreachablePod: a pool pod the cache lists but
// nothing answers at (gone, the informer behind) costs a claim its dial,
// not the call: the claim deletes it and takes the next pod.
func TestClaimPassesOverAnUnreachablePod(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	// gone is the older, so the first tried; nothing listens on its IP.
	e.add(poolDeploy("echo"), e.fnFor("hello", "echo"),
		poolPod("gone", "echo", ip("127.0.0.9"), readyAt(t0.Add(-time.Hour))), poolPod("p1", "echo"))
	r := startReplica(t, e, "ctl-0", nil, nil)
	resp, err := getInstance(t.Context(), r, "hello", nil)
	if err != nil {
		t.Fatalf("GetInstance: %v", err)
	}
	if got := resp.GetInstances(); len(got) != 1 || got[0].GetPod() != "p1" {
		t.Errorf("instances %v, want p1", got)
	}
	if _, err := e.core.CoreV1().Pods("default").Get(t.Context(), "gone", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("pod gone after its assign reached nobody: err = %v, want NotFound (deleted)", err)
	}
}

// TestClaimPassesOverOneUnreachablePodOnly: when every pool pod refuses
// the connection (the Function's port is wrong, a policy blocks the
// controller), a call passes over one pod and is answered with the
// second's failure: the pool is not deleted pod by pod.
func TestClaimPassesOverOneUnreachablePodOnly(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	e.add(poolDeploy("echo"), e.fnFor("hello", "echo"),
		poolPod("a", "echo", ip("127.0.0.9")), poolPod("b", "echo", ip("127.0.0.9")), poolPod("c", "echo", ip("127.0.0.9")))
	r := startReplica(t, e, "ctl-0", nil, nil)
	_, err := getInstance(t.Context(), r, "hello", nil)
	if st := status.Convert(err); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "connection refused") {
		t.Fatalf("GetInstance = %v, want Unavailable naming the refused connection", err)
	}
	pods, err := e.core.CoreV1().Pods("default").List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 1 {
		t.Errorf("%d of 3 pool pods left after one call, want 1 (two tried and deleted)", len(pods.Items))
	}
}

// TestClaimAssignsOnTheAgentsPort: a pool pod whose native sidecar (the
// agent) names a port skipper-assign is assigned, asked and pre-connected
// there; the instance set has the application's port (traffic goes
// straight to the application).
func TestClaimAssignsOnTheAgentsPort(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	fn := e.fnFor("hello", "echo")
	fn.Spec.Port = 9 // the application's: nothing serves the contract there
	agent := func(p *corev1.Pod) {
		p.Spec.InitContainers = []corev1.Container{{Name: "skipper-agent",
			Ports: []corev1.ContainerPort{{Name: v1alpha1.AssignPortName, ContainerPort: e.assignPort}}}}
	}
	e.add(poolDeploy("echo"), fn, poolPod("p1", "echo", agent))
	r := startReplica(t, e, "ctl-0", nil, nil)
	resp, err := getInstance(t.Context(), r, "hello", nil)
	if err != nil {
		t.Fatalf("GetInstance: %v", err)
	}
	if got := resp.GetInstances(); len(got) != 1 || got[0].GetAddress() != "127.0.0.1:9" {
		t.Fatalf("instances %v, want p1 at the application's port 9", got)
	}
	if reqs := e.assignRequests(); len(reqs) != 1 || reqs[0].Function != "default/hello" {
		t.Errorf("assigns the agent's port saw: %+v", reqs)
	}
}
