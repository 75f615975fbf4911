package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/controller/trust"
	"skipper.dev/skipper/internal/poll"
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

// controllerClient dials a controller replica's gRPC port in plaintext
// with token ("": none).
func controllerClient(t *testing.T, pod *corev1.Pod, token string) skipperv1.ControllerClient {
	t.Helper()
	return controllerClientWith(t, pod, token, insecure.NewCredentials())
}

// controllerClientWith dials a controller replica's gRPC port with
// transport (TLS, say) and token ("": none).
func controllerClientWith(t *testing.T, pod *corev1.Pod, token string, transport credentials.TransportCredentials) skipperv1.ControllerClient {
	t.Helper()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(transport)}
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

// functionOwner is the name of the controller pod that owns Function
// default/fn, once its status names one.
func functionOwner(t *testing.T, fn string) string {
	t.Helper()
	var owner string
	poll.Until(t, 10*time.Second, 200*time.Millisecond, "an owner in the Function's status", func(context.Context) error {
		if owner, _ = functionStatus(t, fn)["owner"].(string); owner == "" {
			return errors.New("no owner")
		}
		return nil
	})
	return owner
}

// functionOwnerPod is the controller pod that owns Function default/fn,
// once its status names one.
func functionOwnerPod(t *testing.T, fn string) *corev1.Pod {
	t.Helper()
	owner := functionOwner(t, fn)
	pod, err := env.kube.CoreV1().Pods("skipper-system").Get(t.Context(), owner, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("owner pod %s: %v", owner, err)
	}
	return pod
}

// TestHostileCallers (issue 16): the controllers' gRPC port refuses every
// caller that is not the router its token names, and nothing changes.
func TestHostileCallers(t *testing.T) {
	const fn = "trusted"
	createFunction(t, fn, map[string]any{"maxInstances": int64(2), "idleTimeout": "5m"})
	ref := &skipperv1.FunctionRef{Namespace: "default", Name: fn}
	firstCall(t, "default/"+fn)
	ownerPod := functionOwnerPod(t, fn)
	routers := podsOf(t, "skipper-system", "app.kubernetes.io/name=skipper-noderouter")
	if len(routers) < 2 {
		t.Fatalf("%d routers, want one per node (2)", len(routers))
	}
	r1, r2 := &routers[0], &routers[1]
	id := func(p *corev1.Pod) *skipperv1.RouterIdentity {
		return &skipperv1.RouterIdentity{Node: p.Spec.NodeName, Pod: p.Namespace + "/" + p.Name, Incarnation: "hostile"}
	}
	// The first call's record (the pod's label) lands after the call:
	// count the instances once it has. The pool then makes a replacement,
	// which is not on a node at first: the workload is a scheduled pod.
	poll.Until(t, 10*time.Second, 200*time.Millisecond, "the first call's instance recorded", func(context.Context) error {
		if n := instances(t, fn); n <= 0 {
			return fmt.Errorf("%d instances", n)
		}
		return nil
	})
	var workload *corev1.Pod
	poll.Until(t, 30*time.Second, 200*time.Millisecond, "an echo pod on a node, to take a workload's token from", func(context.Context) error {
		for _, p := range podsOf(t, "default", "skipper.dev/pool=echo") {
			if p.Spec.NodeName != "" && p.Status.Phase == corev1.PodRunning {
				workload = &p
				return nil
			}
		}
		return errors.New("none running on a node")
	})
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
	ownerPod := functionOwnerPod(t, fn)
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

// TestControllerIdentityLimited (issue 16): what RBAC cannot narrow, the
// ValidatingAdmissionPolicies in deploy/base do. Acting as the controller's
// ServiceAccount (impersonated), a pod's image cannot be patched, a pod of
// no pool cannot be deleted nor relabelled, and a ConfigMap of another
// name cannot be created; nor can it make the pod a pool pod, give it an
// owner or a finalizer. Nothing changes.
// asControllerClient is a client that impersonates the controllers'
// ServiceAccount: RBAC and the admission policies apply to it as to them.
func asControllerClient(t *testing.T) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", env.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:skipper-system:skipper-controller",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:skipper-system", "system:authenticated"}}
	asController, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return asController
}

func TestControllerIdentityLimited(t *testing.T) {
	asController := asControllerClient(t)
	// A pod of no pool, on no node (nothing runs it).
	name := fmt.Sprintf("vap-%d", time.Now().UnixNano()%100000)
	pod, err := env.kube.CoreV1().Pods("default").Create(t.Context(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "bystander"}},
		Spec:       corev1.PodSpec{NodeName: "nowhere", Containers: []corev1.Container{{Name: "app", Image: env.image}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.kube.CoreV1().Pods("default").Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	})
	pods := asController.CoreV1().Pods("default")
	refused := func(what string, err error, want string) {
		t.Helper()
		if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s as the controller: %v, want refused with %q", what, err, want)
		} else {
			t.Logf("%s as the controller: %v", what, err)
		}
	}
	merge := func(patch string) error {
		_, err := pods.Patch(t.Context(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		return err
	}
	_, err = pods.Patch(t.Context(), name, types.JSONPatchType, []byte(`[{"op":"replace","path":"/spec/containers/0/image","value":"evil.example/miner"}]`), metav1.PatchOptions{})
	refused("patching a pod's image", err, "changes no pod's spec")
	refused("changing a pod's own label", merge(`{"metadata":{"labels":{"app":"mine"}}}`), "only skipper.dev/ labels")
	refused("deleting a pod of no pool", pods.Delete(t.Context(), name, metav1.DeleteOptions{}), "only pods of a pool")
	_, err = asController.CoreV1().ConfigMaps("default").Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "not-the-key"}}, metav1.CreateOptions{})
	refused("creating another ConfigMap", err, "only the ConfigMap and Secret skipper-assign-key")
	// Services: only a Function's own, an ExternalName of the routers'.
	_, err = asController.CoreV1().Services("default").Create(t.Context(), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{})
	refused("creating a Service of no Function", err, "only Services owned by the Function of their name")
	_, err = asController.CoreV1().Services("default").Create(t.Context(), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name,
		OwnerReferences: []metav1.OwnerReference{{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: "Function", Name: name,
			UID: "00000000-0000-0000-0000-000000000002", Controller: ptr.To(true)}}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "evil.example.com"}}, metav1.CreateOptions{})
	refused("creating a Function's Service naming elsewhere", err, "naming the routers' Service")
	_, err = asController.CoreV1().Services("default").Create(t.Context(), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name,
		OwnerReferences: []metav1.OwnerReference{{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: "Function", Name: name,
			UID: "00000000-0000-0000-0000-000000000002", Controller: ptr.To(true)}}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "skipper.skipper-system.svc.evil.example"}}, metav1.CreateOptions{})
	refused("creating a Function's Service naming a name that only starts as the routers'", err, "naming the routers' Service")
	// Making it a pool pod, to delete it next; taking it over through an
	// ownerReference (the garbage collector would delete it); a finalizer.
	refused("adding skipper.dev/pool to a pod", merge(`{"metadata":{"labels":{"skipper.dev/pool":"echo"}}}`), "updates only pool pods")
	refused("giving a pod an owner", merge(`{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"ConfigMap","name":"x","uid":"00000000-0000-0000-0000-000000000001"}]}}`), "updates only pool pods")
	refused("adding a finalizer", merge(`{"metadata":{"finalizers":["example.com/hold"]}}`), "updates only pool pods")
	got, err := env.kube.CoreV1().Pods("default").Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the pod after the refusals: %v", err)
	}
	if got.Spec.Containers[0].Image != pod.Spec.Containers[0].Image || got.Labels["app"] != "bystander" ||
		len(got.Labels) != 1 || len(got.OwnerReferences) != 0 || len(got.Finalizers) != 0 {
		t.Errorf("the pod changed: image %s, app=%s", got.Spec.Containers[0].Image, got.Labels["app"])
	}
	if _, err := env.kube.CoreV1().ConfigMaps("default").Get(t.Context(), "not-the-key", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("ConfigMap not-the-key: %v, want not found", err)
	}

	// Deployments: the pool autoscaler's patch of spec.replicas, on
	// autoscaled pools only (TestPoolAutoscales shows it allowed there).
	// A Deployment of no pool, and a pool that did not opt in: no replicas
	// change, and nothing else either; the scale subresource not at all.
	for _, d := range []*appsv1.Deployment{
		vapDeployment(name+"-app", map[string]string{"app": "bystander"}, nil),
		vapDeployment(name+"-pool", map[string]string{v1alpha1.LabelPool: name + "-pool"}, nil),
	} {
		if _, err := env.kube.AppsV1().Deployments("default").Create(t.Context(), d, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = env.kube.AppsV1().Deployments("default").Delete(context.Background(), d.Name, metav1.DeleteOptions{})
		})
		deps := asController.AppsV1().Deployments("default")
		_, err := deps.Patch(t.Context(), d.Name, types.MergePatchType, []byte(`{"spec":{"replicas":5}}`), metav1.PatchOptions{})
		refused("scaling Deployment "+d.Name, err, "scales only pool Deployments annotated")
		_, err = deps.Patch(t.Context(), d.Name, types.JSONPatchType, []byte(`[{"op":"replace","path":"/spec/template/spec/containers/0/image","value":"evil.example/miner"}]`), metav1.PatchOptions{})
		refused("patching Deployment "+d.Name+"'s image", err, "scales only pool Deployments annotated")
		_, err = deps.Patch(t.Context(), d.Name, types.MergePatchType, []byte(`{"spec":{"replicas":5}}`), metav1.PatchOptions{}, "scale")
		if !apierrors.IsForbidden(err) {
			t.Errorf("scaling Deployment %s through its scale subresource: %v, want Forbidden (no RBAC grant)", d.Name, err)
		}
		got, err := env.kube.AppsV1().Deployments("default").Get(t.Context(), d.Name, metav1.GetOptions{})
		if err != nil || *got.Spec.Replicas != 0 || got.Spec.Template.Spec.Containers[0].Image != d.Spec.Template.Spec.Containers[0].Image {
			t.Errorf("Deployment %s changed: %v %v", d.Name, got, err)
		}
	}
	// An autoscaled pool: its replicas are the controller's, nothing else.
	pool := vapDeployment(name+"-auto", map[string]string{v1alpha1.LabelPool: name + "-auto"}, map[string]string{v1alpha1.AnnotationAutoscale: "true"})
	if _, err := env.kube.AppsV1().Deployments("default").Create(t.Context(), pool, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.kube.AppsV1().Deployments("default").Delete(context.Background(), pool.Name, metav1.DeleteOptions{})
	})
	deps := asController.AppsV1().Deployments("default")
	_, err = deps.Patch(t.Context(), pool.Name, types.JSONPatchType, []byte(`[{"op":"replace","path":"/spec/template/spec/containers/0/image","value":"evil.example/miner"}]`), metav1.PatchOptions{})
	refused("patching an autoscaled pool's image", err, "changes only spec.replicas")
	refused("dropping an autoscaled pool's annotation", func() error {
		_, err := deps.Patch(t.Context(), pool.Name, types.MergePatchType, []byte(`{"metadata":{"annotations":{"skipper.dev/autoscale":null}}}`), metav1.PatchOptions{})
		return err
	}(), "changes only spec.replicas")
	if _, err := deps.Patch(t.Context(), pool.Name, types.MergePatchType, []byte(`{"spec":{"replicas":0}}`), metav1.PatchOptions{}); err != nil {
		t.Errorf("setting an autoscaled pool's replicas as the controller: %v, want allowed", err)
	}
	if got, err := env.kube.AppsV1().Deployments("default").Get(t.Context(), pool.Name, metav1.GetOptions{}); err != nil ||
		got.Spec.Template.Spec.Containers[0].Image != pool.Spec.Template.Spec.Containers[0].Image || got.Annotations[v1alpha1.AnnotationAutoscale] != "true" {
		t.Errorf("the autoscaled pool changed: %v %v", got, err)
	}
}

// vapDeployment is a Deployment of no replicas with labels on itself and
// its template, and annotations.
func vapDeployment(name string, labels, annotations map[string]string) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: annotations},
		Spec: appsv1.DeploymentSpec{
			Replicas: new(int32),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: env.image}}},
			},
		},
	}
}
