package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"skipper.dev/skipper/internal/tick"
	skipperv1 "skipper.dev/skipper/proto/skipperv1"
)

// tokenLife is the life of the in-process router's tokens (the API
// server's shortest), and tokenRenew how often a new one is written.
const (
	tokenLife  = 600
	tokenRenew = 4 * time.Minute
)

// routerIdentity gives the in-process router what a DaemonSet router has
// (the controllers authenticate every caller, docs/security.md): a pod of
// the router's ServiceAccount on node1 whose name it takes, and a file with
// a token bound to that pod, renewed until ctx ends. The pod runs nothing
// but a command that exits, from image (the Skipper image the nodes pull;
// a token is bound to the pod object, not to what it runs). cleanup
// deletes the pod.
func routerIdentity(ctx context.Context, cs kubernetes.Interface, name, image string) (tokenFile string, cleanup func(), err error) {
	pods := cs.CoreV1().Pods("skipper-system")
	pod, err := pods.Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app.kubernetes.io/part-of": "skipper-integration"}},
		Spec: corev1.PodSpec{
			ServiceAccountName: "skipper-noderouter", NodeName: "node1", RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "identity", Image: image, Command: []string{"/skipper-echo", "--help"}}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", nil, fmt.Errorf("router identity pod: %w", err)
	}
	cleanup = func() {
		_ = pods.Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	}
	dir, err := os.MkdirTemp("", "skipper-integration-token-")
	if err != nil {
		cleanup()
		return "", nil, err
	}
	tokenFile = filepath.Join(dir, "token")
	write := func(ctx context.Context) error {
		exp := int64(tokenLife)
		tr, err := cs.CoreV1().ServiceAccounts("skipper-system").CreateToken(ctx, "skipper-noderouter", &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{Audiences: []string{skipperv1.Audience}, ExpirationSeconds: &exp,
				BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}},
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("router token: %w", err)
		}
		tmp := tokenFile + ".new"
		if err := os.WriteFile(tmp, []byte(tr.Status.Token), 0o600); err != nil {
			return err
		}
		return os.Rename(tmp, tokenFile) // the router never reads half a token
	}
	if err := write(ctx); err != nil {
		cleanup()
		_ = os.RemoveAll(dir)
		return "", nil, err
	}
	renewed := make(chan struct{})
	go func() { // owned by ctx: renews until the tests end
		defer close(renewed)
		tick.After(ctx, tokenRenew, func(time.Time) {
			if err := write(ctx); err != nil && ctx.Err() == nil {
				fmt.Fprintln(os.Stderr, "integration:", err)
			}
		})
	}()
	stop := cleanup
	return tokenFile, func() { <-renewed; stop(); _ = os.RemoveAll(dir) }, nil
}
