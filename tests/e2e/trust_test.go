package e2e

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"skipper.dev/skipper/controller/trust"
	skipperv1 "skipper.dev/skipper/proto/skipperv1"
)

// bearer is per-call credentials of a fixed token.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{trust.HeaderAuthorization: "Bearer " + string(b)}, nil
}
func (bearer) RequireTransportSecurity() bool { return false }

// podToken mints a token of pod's ServiceAccount bound to pod, for
// audience skipper, as the kubelet projects one.
func podToken(t *testing.T, pod *corev1.Pod) string {
	t.Helper()
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	exp := int64(600)
	tr, err := env.kube.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(t.Context(), sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{trust.Audience}, ExpirationSeconds: &exp,
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for %s/%s: %v", pod.Namespace, pod.Name, err)
	}
	return tr.Status.Token
}

// controllerClient dials a controller replica's gRPC port with token ("":
// none).
func controllerClient(t *testing.T, pod *corev1.Pod, token string) skipperv1.ControllerClient {
	t.Helper()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer(token)))
	}
	conn, err := grpc.NewClient(net.JoinHostPort(pod.Status.PodIP, "9090"), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return skipperv1.NewControllerClient(conn)
}

// podsOf lists ns's pods with selector.
func podsOf(t *testing.T, ns, selector string) []corev1.Pod {
	t.Helper()
	pods, err := env.kube.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	return pods.Items
}

// wantCode checks err's code and that its message holds want.
func wantCode(t *testing.T, what string, err error, code codes.Code, want string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != code || !strings.Contains(st.Message(), want) {
		t.Errorf("%s: %s %q, want %s containing %q", what, st.Code(), st.Message(), code, want)
	} else {
		t.Logf("%s: %s %q", what, st.Code(), st.Message())
	}
}

// TestHostileCallers (issue 16): the controllers' gRPC port refuses every
// caller that is not the router its token names, and nothing changes.
func TestHostileCallers(t *testing.T) {
	const fn = "trusted"
	createFunction(t, fn, map[string]any{"maxInstances": int64(2), "idleTimeout": "5m"})
	ref := &skipperv1.FunctionRef{Namespace: "default", Name: fn}
	firstCall(t, "default/"+fn)
	var owner string
	waitFor(t, 10*time.Second, "an owner in the Function's status", func() bool {
		owner, _ = functionStatus(t, fn)["owner"].(string)
		return owner != ""
	})
	ownerPod, err := env.kube.CoreV1().Pods("skipper-system").Get(t.Context(), owner, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	routers := podsOf(t, "skipper-system", "app.kubernetes.io/name=skipper-noderouter")
	if len(routers) < 2 {
		t.Fatalf("%d routers, want one per node (2)", len(routers))
	}
	r1, r2 := &routers[0], &routers[1]
	id := func(p *corev1.Pod) *skipperv1.RouterIdentity {
		return &skipperv1.RouterIdentity{Node: p.Spec.NodeName, Pod: p.Namespace + "/" + p.Name, Incarnation: "hostile"}
	}
	workloads := podsOf(t, "default", "skipper.dev/pool=echo")
	if len(workloads) == 0 {
		t.Fatal("no echo pods to take a workload's token from")
	}
	workload := &workloads[0]
	before := instances(t, fn)
	desired := functionStatus(t, fn)["desired"]

	noToken := controllerClient(t, ownerPod, "")
	asWorkload := controllerClient(t, ownerPod, podToken(t, workload))
	asRouter1 := controllerClient(t, ownerPod, podToken(t, r1))
	get := func(cl skipperv1.ControllerClient, rid *skipperv1.RouterIdentity) error {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		_, err := cl.GetInstance(ctx, &skipperv1.GetInstanceRequest{Function: ref, Router: rid})
		return err
	}

	wantCode(t, "GetInstance with no token", get(noToken, id(r1)), codes.Unauthenticated, "no bearer token")
	wantCode(t, "GetInstance with a forged token", get(controllerClient(t, ownerPod, "not-a-token"), id(r1)), codes.Unauthenticated, "")
	wantCode(t, "GetInstance with a workload pod's token", get(asWorkload, &skipperv1.RouterIdentity{
		Node: workload.Spec.NodeName, Pod: workload.Namespace + "/" + workload.Name}), codes.PermissionDenied, "not a router")
	wantCode(t, "GetInstance by router 1 naming router 2", get(asRouter1, id(r2)), codes.PermissionDenied, "but the token is pod")
	if err := get(asRouter1, id(r1)); err != nil {
		t.Errorf("GetInstance by router 1 as itself: %v", err)
	}

	// Router 1's token on a stream naming node 2: refused at the Hello, so
	// no report of it ever counts for node 2.
	stream, err := asRouter1.Connect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	r2id := id(r2)
	r2id.Pod = "skipper-system/" + r1.Name // its own pod, another node
	if err := stream.Send(&skipperv1.RouterMessage{Message: &skipperv1.RouterMessage_Hello{Hello: &skipperv1.Hello{Router: r2id}}}); err != nil {
		t.Fatal(err)
	}
	_, err = stream.Recv()
	wantCode(t, "Connect by router 1 naming node "+r2.Spec.NodeName, err, codes.PermissionDenied, "names node")

	// A oneshot instance is released only by the router it was handed to:
	// router 1 cannot speak as router 2.
	_, err = asRouter1.ReleaseInstance(t.Context(), &skipperv1.ReleaseInstanceRequest{Function: ref, Router: id(r2), PodUid: "any"})
	wantCode(t, "ReleaseInstance by router 1 as router 2", err, codes.PermissionDenied, "but the token is pod")

	// GetState is for the replicas (and an opt-in debug group).
	for _, c := range []struct {
		name string
		cl   skipperv1.ControllerClient
		code codes.Code
		msg  string
	}{
		{"no token", noToken, codes.Unauthenticated, "no bearer token"},
		{"a workload", asWorkload, codes.PermissionDenied, "GetState is for controller replicas"},
		{"a router", asRouter1, codes.PermissionDenied, "GetState is for controller replicas"},
	} {
		_, err := c.cl.GetState(t.Context(), &skipperv1.GetStateRequest{})
		wantCode(t, "GetState by "+c.name, err, c.code, c.msg)
	}
	if _, err := controllerClient(t, ownerPod, podToken(t, ownerPod)).GetState(t.Context(), &skipperv1.GetStateRequest{}); err != nil {
		t.Errorf("GetState by a replica: %v", err)
	}

	// Nothing changed: the same instances, the same desired count.
	if got := instances(t, fn); got != before {
		t.Errorf("%s has %d instances after the hostile calls, had %d", fn, got, before)
	}
	if got := functionStatus(t, fn)["desired"]; fmt.Sprint(got) != fmt.Sprint(desired) {
		t.Errorf("%s desired %v after the hostile calls, was %v", fn, got, desired)
	}
}

// TestTokensThroughAPIServerOutage (issue 16): with kube-apiserver stopped,
// a router token a replica reviewed before is honoured from the cache, a
// router token it never saw is verified against the API server's signing
// keys, and a forged one is still refused.
func TestTokensThroughAPIServerOutage(t *testing.T) {
	const fn = "trusted-outage"
	createFunction(t, fn, map[string]any{"idleTimeout": "5m"})
	ref := &skipperv1.FunctionRef{Namespace: "default", Name: fn}
	firstCall(t, "default/"+fn)
	var owner string
	waitFor(t, 10*time.Second, "an owner in the Function's status", func() bool {
		owner, _ = functionStatus(t, fn)["owner"].(string)
		return owner != ""
	})
	ownerPod, err := env.kube.CoreV1().Pods("skipper-system").Get(t.Context(), owner, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := podsOf(t, "skipper-system", "app.kubernetes.io/name=skipper-noderouter")[0]
	rid := &skipperv1.RouterIdentity{Node: r.Spec.NodeName, Pod: r.Namespace + "/" + r.Name, Incarnation: "outage"}
	get := func(cl skipperv1.ControllerClient) error {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		_, err := cl.GetInstance(ctx, &skipperv1.GetInstanceRequest{Function: ref, Router: rid})
		return err
	}
	reviewed := controllerClient(t, ownerPod, podToken(t, &r))
	if err := get(reviewed); err != nil {
		t.Fatalf("GetInstance before the outage: %v", err)
	}
	unseen := controllerClient(t, ownerPod, podToken(t, &r)) // minted now, first used in the outage

	start := stopAPIServer(t)
	if err := get(reviewed); err != nil {
		t.Errorf("GetInstance with a reviewed token, API server down: %v", err)
	}
	if err := get(unseen); err != nil {
		t.Errorf("GetInstance with a token never reviewed, API server down: %v", err)
	}
	wantCode(t, "GetInstance with a forged token, API server down", get(controllerClient(t, ownerPod, "forged.token.sig")),
		codes.Unauthenticated, "")
	start()
}
