package controller

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/controller/assign"
	"skipper.dev/skipper/internal/tick"
)

// Keys of Secret skipper-assign-key.
const (
	assignKeySecret     = "skipper-assign-key"
	assignKeyPrivateKey = "ed25519.key"
	assignKeyPublicKey  = v1alpha1.AssignKeyConfigMapKey
	managedByLabel      = "app.kubernetes.io/managed-by"
	managedByValue      = "skipper-controller"
)

// assignKey is the key the controller signs assigns with, and the public
// keys it publishes for instances to verify them with.
type assignKey struct {
	sign ed25519.PrivateKey
	// pubPEM is the PEM of every public key published: the signing key's
	// first, then the others of the Secret's ed25519.pub in their order
	// (a key rotation's other key).
	pubPEM []byte
	// replaced is the pubPEM this key replaced in the controller (nil for
	// the first): a ConfigMap holding it is merely not rewritten yet.
	replaced []byte
}

// newAssignKey returns sign's assignKey, publishing the public keys in
// published (PEM blocks, may be empty) besides its own.
func newAssignKey(sign ed25519.PrivateKey, published []byte) (assignKey, error) {
	own := sign.Public().(ed25519.PublicKey)
	keys := []ed25519.PublicKey{own}
	if len(published) > 0 {
		listed, err := assign.ParsePublicKeys(published)
		if err != nil {
			return assignKey{}, err
		}
		for _, k := range listed {
			if !slices.ContainsFunc(keys, func(have ed25519.PublicKey) bool { return have.Equal(k) }) {
				keys = append(keys, k)
			}
		}
	}
	var pubPEM []byte
	for _, k := range keys {
		b, err := assign.MarshalPublicKey(k)
		if err != nil {
			return assignKey{}, err
		}
		pubPEM = append(pubPEM, b...)
	}
	return assignKey{sign: sign, pubPEM: pubPEM}, nil
}

// Back-off of the start-up read of the assign key while the API server
// cannot answer it.
const (
	assignKeyBackoffBase = 250 * time.Millisecond
	assignKeyBackoffMax  = 5 * time.Second
)

// errBadKeySecret marks a key Secret whose keys do not parse: waiting
// does not mend it.
var errBadKeySecret = errors.New("assign key Secret unusable")

// waitAssignKey is loadOrCreateAssignKey tried until it succeeds, ctx
// ends or the Secret is found unusable. A replica starting while the API
// server is away (or the kubernetes Service still rejects connections
// after it came back) waits, not ready, instead of exiting: each exit
// lengthens the kubelet's crash-loop back-off (10 s, doubling to 5 min),
// and a replica killed during an outage came back a minute after the API
// server did (the e2e flake of TestColdStartWhileAPIServerDown).
func waitAssignKey(ctx context.Context, core kubernetes.Interface, ns string, log *slog.Logger) (assignKey, error) {
	backoff := doubling(assignKeyBackoffBase, assignKeyBackoffMax)
	began := time.Now()
	for attempt := 1; ; attempt++ {
		key, err := loadOrCreateAssignKey(ctx, core, ns)
		if err == nil {
			if attempt > 1 {
				log.Info("assign key read", "attempts", attempt, "waited", time.Since(began).Round(time.Millisecond))
			}
			return key, nil
		}
		if errors.Is(err, errBadKeySecret) || ctx.Err() != nil {
			return assignKey{}, err
		}
		in := backoff.Step()
		log.Warn("assign key not read yet; not ready until it is", "attempt", attempt, "in", in, "err", err)
		t := time.NewTimer(in)
		select {
		case <-ctx.Done():
			t.Stop()
			return assignKey{}, fmt.Errorf("%w (stopped waiting: %w)", err, ctx.Err())
		case <-t.C:
		}
	}
}

// loadOrCreateAssignKey returns the key in Secret skipper-assign-key in
// ns, creating the Secret with a fresh pair when it is missing. When another
// replica creates it first (AlreadyExists), that replica's pair is read and
// used, so every replica signs with the same key.
func loadOrCreateAssignKey(ctx context.Context, core kubernetes.Interface, ns string) (assignKey, error) {
	secrets := core.CoreV1().Secrets(ns)
	s, err := secrets.Get(ctx, assignKeySecret, metav1.GetOptions{})
	if err == nil {
		return keyFromSecret(s)
	}
	if !apierrors.IsNotFound(err) {
		return assignKey{}, fmt.Errorf("get secret %s/%s: %w", ns, assignKeySecret, err)
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return assignKey{}, fmt.Errorf("generate assign key: %w", err)
	}
	privPEM, err := assign.MarshalPrivateKey(priv)
	if err != nil {
		return assignKey{}, err
	}
	key, err := newAssignKey(priv, nil)
	if err != nil {
		return assignKey{}, err
	}
	_, err = secrets.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:      assignKeySecret,
			Namespace: ns,
			Labels:    map[string]string{managedByLabel: managedByValue},
		},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{assignKeyPrivateKey: privPEM, assignKeyPublicKey: key.pubPEM},
	}, metav1.CreateOptions{})
	switch {
	case err == nil:
		return key, nil
	case apierrors.IsAlreadyExists(err):
		// Another replica won the race: use its key.
		s, err := secrets.Get(ctx, assignKeySecret, metav1.GetOptions{})
		if err != nil {
			return assignKey{}, fmt.Errorf("get secret %s/%s after losing the create race: %w", ns, assignKeySecret, err)
		}
		return keyFromSecret(s)
	}
	return assignKey{}, fmt.Errorf("create secret %s/%s: %w", ns, assignKeySecret, err)
}

// keyFromSecret reads Secret skipper-assign-key: it signs with the
// private key ed25519.key and publishes its public key along with every
// PEM public key in ed25519.pub (which holds two while a key rotates:
// docs/operations.md).
func keyFromSecret(s *corev1.Secret) (assignKey, error) {
	priv, err := assign.ParsePrivateKey(s.Data[assignKeyPrivateKey])
	if err != nil {
		return assignKey{}, fmt.Errorf("%w: secret %s/%s key %s: %w", errBadKeySecret, s.Namespace, s.Name, assignKeyPrivateKey, err)
	}
	k, err := newAssignKey(priv, s.Data[assignKeyPublicKey])
	if err != nil {
		return assignKey{}, fmt.Errorf("%w: secret %s/%s key %s: %w", errBadKeySecret, s.Namespace, s.Name, assignKeyPublicKey, err)
	}
	return k, nil
}

// equal reports whether k and o sign with the same key and publish the
// same keys.
func (k *assignKey) equal(o *assignKey) bool {
	return k.sign.Equal(o.sign) && bytes.Equal(k.pubPEM, o.pubPEM)
}

// reloadAssignKey reads Secret skipper-assign-key again and returns the
// key to use. When it changed, the controller signs with it from now on
// and every namespace with a key ConfigMap is synced to publish it. On
// an error the key in use stays.
func (c *controller) reloadAssignKey(ctx context.Context) (*assignKey, error) {
	c.keyMu.Lock()
	defer c.keyMu.Unlock()
	s, err := c.core.CoreV1().Secrets(c.cfg.PodNamespace).Get(ctx, assignKeySecret, metav1.GetOptions{})
	if err != nil {
		return c.key.Load(), fmt.Errorf("get secret %s/%s: %w", c.cfg.PodNamespace, assignKeySecret, err)
	}
	k, err := keyFromSecret(s)
	if err != nil {
		return c.key.Load(), err
	}
	if old := c.key.Load(); old.equal(&k) {
		return old, nil
	}
	k.replaced = c.key.Load().pubPEM
	c.key.Store(&k)
	c.log.Info("assign key changed", "secret", c.cfg.PodNamespace+"/"+assignKeySecret,
		"published", bytes.Count(k.pubPEM, []byte("-----BEGIN ")))
	for _, ns := range c.cache.keyConfigMapNamespaces() {
		c.nsQueue.Add(ns)
	}
	return &k, nil
}

// watchAssignKey reads the Secret again every --assign-key-interval until
// ctx ends, so a rotation step is taken without a restart.
func (c *controller) watchAssignKey(ctx context.Context) {
	tick.Every(ctx, c.cfg.AssignKeyInterval, func(time.Time) {
		if _, err := c.reloadAssignKey(ctx); err != nil && ctx.Err() == nil {
			c.log.Warn("read the assign key again; keeping the one in use", "err", err)
		}
	})
}

// publishKeyConfigMap makes ConfigMap skipper-assign-key in ns hold every
// key published (key.pubPEM, concatenated), given the cached copy (nil
// when absent). It writes only when the ConfigMap differs, so repeating it
// is free. A ConfigMap holding neither what key publishes nor what it
// replaced was written by another replica from a newer read of the Secret
// (or an older one): reload reads the Secret again and returns the key to
// write instead, so replicas converge on the Secret rather than undo each
// other's writes. That holds when the cache lags behind a create too: the
// ConfigMap the API holds is read and judged the same way, never
// overwritten blindly.
func publishKeyConfigMap(ctx context.Context, core kubernetes.Interface, ns string, cached *corev1.ConfigMap, key *assignKey, reload func(context.Context) (*assignKey, error)) error {
	cms := core.CoreV1().ConfigMaps(ns)
	if cached == nil {
		_, err := cms.Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{
				Name:      v1alpha1.AssignKeyConfigMap,
				Namespace: ns,
				Labels:    map[string]string{managedByLabel: managedByValue},
			},
			Data: map[string]string{assignKeyPublicKey: string(key.pubPEM)},
		}, metav1.CreateOptions{})
		if err == nil {
			return nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create configmap %s/%s: %w", ns, v1alpha1.AssignKeyConfigMap, err)
		}
		// The cache lags behind a create: judge what the API holds.
		if cached, err = cms.Get(ctx, v1alpha1.AssignKeyConfigMap, metav1.GetOptions{}); err != nil {
			return fmt.Errorf("get configmap %s/%s after a create found it: %w", ns, v1alpha1.AssignKeyConfigMap, err)
		}
	}
	have := cached.Data[assignKeyPublicKey]
	if have != string(key.pubPEM) && have != string(key.replaced) {
		var err error
		if key, err = reload(ctx); err != nil {
			return err
		}
	}
	if have == string(key.pubPEM) {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"data": map[string]string{assignKeyPublicKey: string(key.pubPEM)}})
	if err != nil {
		return err
	}
	if _, err := cms.Patch(ctx, v1alpha1.AssignKeyConfigMap, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("patch configmap %s/%s: %w", ns, v1alpha1.AssignKeyConfigMap, err)
	}
	return nil
}

// deleteKeyConfigMap deletes cached, the ConfigMap skipper-assign-key of a
// namespace that no longer holds a pool or a Function, when this
// controller made it (labelled managed-by skipper-controller); one made by
// anyone else is left alone; so is one re-created meanwhile (deleteUID).
// It reports whether it deleted one.
func deleteKeyConfigMap(ctx context.Context, core kubernetes.Interface, cached *corev1.ConfigMap) (bool, error) {
	if cached == nil || cached.Labels[managedByLabel] != managedByValue || cached.DeletionTimestamp != nil {
		return false, nil
	}
	deleted, err := deleteUID(ctx, core.CoreV1().ConfigMaps(cached.Namespace), cached.Name, cached.UID)
	if err != nil {
		return false, fmt.Errorf("delete configmap %s/%s: %w", cached.Namespace, cached.Name, err)
	}
	return deleted, nil
}
