package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"skipper.dev/skipper/internal/poll"
	skipperv1 "skipper.dev/skipper/proto/skipperv1"
	"skipper.dev/skipper/proto/skipperv1/tlsfiles"
	"skipper.dev/skipper/proto/skipperv1/tlsfiles/tlstest"
)

// tlsServerName is the name the controllers' certificate carries and
// routers and replicas verify by default.
const tlsServerName = "skipper-controller.skipper-system.svc"

// rollout is how long the controllers' Deployment and the routers'
// DaemonSet get to roll out a template change.
const rollout = 45 * time.Second

// rolledOut reports why the controllers and the routers are not yet all
// updated and ready, with no old pod left.
func rolledOut(ctx context.Context) error {
	d, err := env.kube.AppsV1().Deployments("skipper-system").Get(ctx, "skipper-controller", metav1.GetOptions{})
	if err != nil {
		return err
	}
	if n := *d.Spec.Replicas; d.Status.ObservedGeneration < d.Generation || d.Status.UpdatedReplicas != n ||
		d.Status.ReadyReplicas != n || d.Status.Replicas != n {
		return fmt.Errorf("controllers: %d updated, %d ready, %d in all, want %d", d.Status.UpdatedReplicas, d.Status.ReadyReplicas, d.Status.Replicas, n)
	}
	ds, err := env.kube.AppsV1().DaemonSets("skipper-system").Get(ctx, "skipper-noderouter", metav1.GetOptions{})
	if err != nil {
		return err
	}
	if n := ds.Status.DesiredNumberScheduled; ds.Status.ObservedGeneration < ds.Generation || ds.Status.UpdatedNumberScheduled != n ||
		ds.Status.NumberReady != n || ds.Status.NumberAvailable != n {
		return fmt.Errorf("routers: %d updated, %d ready, want %d", ds.Status.UpdatedNumberScheduled, ds.Status.NumberReady, n)
	}
	pods, err := env.kube.CoreV1().Pods("skipper-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/part-of=skipper"})
	if err != nil {
		return err
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			return fmt.Errorf("pod %s still terminating", p.Name)
		}
	}
	return nil
}

// enableTLS applies deploy/overlays/tls's patches to the running
// controllers and routers (the cluster was installed from
// overlays/local), waits for both to roll out, and restores their pod
// templates, rolled out again, when the test ends.
func enableTLS(t *testing.T) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(env.root, "deploy", "overlays", "tls", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Patches []struct {
			Target struct{ Kind, Name string }
			Patch  string
		}
	}
	if err := yaml.Unmarshal(b, &k); err != nil {
		t.Fatal(err)
	}
	apps := env.kube.AppsV1()
	d, err := apps.Deployments("skipper-system").Get(t.Context(), "skipper-controller", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ds, err := apps.DaemonSets("skipper-system").Get(t.Context(), "skipper-noderouter", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	restore := func(template corev1.PodTemplateSpec) []byte {
		p, err := json.Marshal([]map[string]any{{"op": "replace", "path": "/spec/template", "value": template}})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	undoController, undoRouter := restore(d.Spec.Template), restore(ds.Spec.Template)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := apps.Deployments("skipper-system").Patch(ctx, d.Name, types.JSONPatchType, undoController, metav1.PatchOptions{}); err != nil {
			t.Errorf("restore the controllers: %v", err)
		}
		if _, err := apps.DaemonSets("skipper-system").Patch(ctx, ds.Name, types.JSONPatchType, undoRouter, metav1.PatchOptions{}); err != nil {
			t.Errorf("restore the routers: %v", err)
		}
		poll.Until(t, rollout, pollInterval, "plaintext rolled back out", rolledOut)
		client := &http.Client{Timeout: 10 * time.Second}
		poll.Until(t, 10*time.Second, pollInterval, "default/echo answering in plaintext again", func(context.Context) error {
			_, err := callEcho(client, "default/echo")
			return err
		})
	})
	for _, p := range k.Patches {
		ops, err := yaml.YAMLToJSON([]byte(p.Patch))
		if err != nil {
			t.Fatal(err)
		}
		switch p.Target.Kind {
		case "Deployment":
			_, err = apps.Deployments("skipper-system").Patch(t.Context(), p.Target.Name, types.JSONPatchType, ops, metav1.PatchOptions{})
		case "DaemonSet":
			_, err = apps.DaemonSets("skipper-system").Patch(t.Context(), p.Target.Name, types.JSONPatchType, ops, metav1.PatchOptions{})
		default:
			t.Fatalf("overlays/tls patches a %s: teach enableTLS", p.Target.Kind)
		}
		if err != nil {
			t.Fatalf("patch %s %s: %v", p.Target.Kind, p.Target.Name, err)
		}
	}
	poll.Until(t, rollout, pollInterval, "TLS rolled out", rolledOut)
}

// TestControllersTLS (issue 16): with Secret skipper-controller-tls and
// deploy/overlays/tls's flags, a router's cold call reaches the owner
// over TLS, a replica that does not own a function forwards to the owner
// over TLS and presents the Secret's certificate, and a plaintext dial of
// the gRPC port is refused; probes keep the replicas Ready.
func TestControllersTLS(t *testing.T) {
	ca := tlstest.NewCA(t)
	leaf := ca.Issue(t, tlsServerName)
	secrets := env.kube.CoreV1().Secrets("skipper-system")
	if _, err := secrets.Create(t.Context(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "skipper-controller-tls"},
		Type:       corev1.SecretTypeTLS,
		Data:       ca.Files(leaf),
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create Secret skipper-controller-tls: %v", err)
	}
	t.Cleanup(func() {
		if err := secrets.Delete(context.Background(), "skipper-controller-tls", metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete Secret skipper-controller-tls: %v", err)
		}
	})
	enableTLS(t)

	// A router's call: a new Function is a cache miss, so router 1 asks
	// its owner over TLS.
	const fn = "tls-e2e"
	createFunction(t, fn, map[string]any{"maxInstances": int64(2), "idleTimeout": "5m"})
	firstCall(t, "default/"+fn)
	owner := functionOwnerPod(t, fn)

	// A forwarded call: router 1's GetInstance to another replica.
	routers := podsOf(t, "skipper-system", "app.kubernetes.io/name=skipper-noderouter")
	if len(routers) == 0 {
		t.Fatal("no routers")
	}
	r1 := &routers[0]
	var other *corev1.Pod
	for _, p := range podsOf(t, "skipper-system", "app.kubernetes.io/name=skipper-controller") {
		if p.Name != owner.Name && podReady(p) {
			other = &p
			break
		}
	}
	if other == nil {
		t.Fatalf("no ready replica besides the owner %s", owner.Name)
	}
	caDir := tlstest.NewDir(t, map[string][]byte{tlsfiles.CAFile: ca.PEM})
	files, err := tlsfiles.Load(caDir.Path, tlsfiles.Options{CA: true})
	if err != nil {
		t.Fatal(err)
	}
	token := podToken(t, r1)
	req := &skipperv1.GetInstanceRequest{Function: &skipperv1.FunctionRef{Namespace: "default", Name: fn},
		Router: &skipperv1.RouterIdentity{Node: r1.Spec.NodeName, Pod: r1.Namespace + "/" + r1.Name, Incarnation: "tls-e2e"}}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var p peer.Peer
	resp, err := controllerClientWith(t, other, token, files.ClientCredentials(tlsServerName)).GetInstance(ctx, req, grpc.Peer(&p))
	if err != nil {
		t.Fatalf("GetInstance over TLS at %s: %v", other.Name, err)
	}
	if resp.GetOwner() != owner.Name {
		t.Errorf("answered by %q, want the owner %s (forwarded by %s)", resp.GetOwner(), owner.Name, other.Name)
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || info.State.PeerCertificates[0].SerialNumber.Cmp(leaf.Serial) != 0 {
		t.Errorf("%s presented %v, want the Secret's certificate (serial %s)", other.Name, p.AuthInfo, leaf.Serial)
	}

	// Plaintext is refused before any method runs.
	_, err = controllerClient(t, other, token).GetInstance(ctx, req)
	if status.Code(err) != codes.Unavailable {
		t.Errorf("plaintext GetInstance: %v, want Unavailable (no TLS handshake)", err)
	} else {
		t.Logf("plaintext GetInstance: %v", err)
	}

	// Probes are HTTP on the metrics port: the replicas stay Ready.
	if err := controllersReady(t.Context()); err != nil {
		t.Errorf("controllers not all Ready over TLS: %v", err)
	}
}
