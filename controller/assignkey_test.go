package controller

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/google/go-cmp/cmp"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/controller/assign"
	"skipper.dev/skipper/internal/poll"
)

func TestPublishKeyConfigMap(t *testing.T) {
	t.Parallel()
	const pem, replaced, newer = "PEM-NEW", "PEM-REPLACED", "PEM-NEWER"
	cm := func(data string) *corev1.ConfigMap {
		return &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: v1alpha1.AssignKeyConfigMap},
			Data:       map[string]string{v1alpha1.AssignKeyConfigMapKey: data, "other": "kept"},
		}
	}
	tests := []struct {
		name       string
		live       *corev1.ConfigMap // in the API
		cached     *corev1.ConfigMap // in the informer
		secret     string            // what the Secret publishes when read again
		wantWrites []string          // verbs
		wantReload bool
		want       string // the ConfigMap's keys after
	}{
		{name: "missing: create", wantWrites: []string{"create"}, want: pem},
		{name: "current: no write", live: cm(pem), cached: cm(pem), want: pem},
		{name: "what the key replaced: patch", live: cm(replaced), cached: cm(replaced), wantWrites: []string{"patch"}, want: pem},
		{name: "cache lags behind our create: no write", live: cm(pem), wantWrites: []string{"create"}, want: pem},
		{name: "cache lags behind a create of what the key replaced: patch", live: cm(replaced), wantWrites: []string{"create", "patch"}, want: pem},
		{name: "another replica's newer read: the Secret read again, no write", live: cm(newer), cached: cm(newer),
			secret: newer, wantReload: true, want: newer},
		{name: "another replica's older read: the Secret read again, patch", live: cm("PEM-OLDER"), cached: cm("PEM-OLDER"),
			secret: pem, wantWrites: []string{"patch"}, wantReload: true, want: pem},
		{name: "cache lags behind another replica's newer write: never undone", live: cm(newer),
			secret: newer, wantWrites: []string{"create"}, wantReload: true, want: newer},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			core := fake.NewClientset()
			if tt.live != nil {
				if err := core.Tracker().Add(tt.live); err != nil {
					t.Fatal(err)
				}
			}
			core.ClearActions()
			reloaded := false
			reload := func(context.Context) (*assignKey, error) {
				reloaded = true
				return &assignKey{pubPEM: []byte(tt.secret), replaced: []byte(pem)}, nil
			}
			key := &assignKey{pubPEM: []byte(pem), replaced: []byte(replaced)}
			if err := publishKeyConfigMap(context.Background(), core, "default", tt.cached, key, reload); err != nil {
				t.Fatal(err)
			}
			var writes []string
			for _, a := range core.Actions() {
				if a.GetVerb() != "get" && a.GetVerb() != "list" {
					writes = append(writes, a.GetVerb())
				}
			}
			if !slices.Equal(writes, tt.wantWrites) {
				t.Errorf("writes = %v, want %v", writes, tt.wantWrites)
			}
			if reloaded != tt.wantReload {
				t.Errorf("Secret read again = %v, want %v", reloaded, tt.wantReload)
			}
			got, err := core.CoreV1().ConfigMaps("default").Get(context.Background(), v1alpha1.AssignKeyConfigMap, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got.Data[v1alpha1.AssignKeyConfigMapKey] != tt.want {
				t.Errorf("data = %v, want the keys %q", got.Data, tt.want)
			}
			if tt.live != nil && got.Data["other"] != "kept" {
				t.Errorf("patch dropped other keys: %v", got.Data)
			}
		})
	}
}

func TestDeleteKeyConfigMap(t *testing.T) {
	t.Parallel()
	cm := func(uid string, labels map[string]string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
			Namespace: "gone", Name: v1alpha1.AssignKeyConfigMap, UID: types.UID(uid), Labels: labels,
		}}
	}
	ours := map[string]string{managedByLabel: managedByValue}
	tests := []struct {
		name        string
		live        *corev1.ConfigMap // in the API
		cached      *corev1.ConfigMap // in the informer
		wantDeleted bool
		wantLive    bool
	}{
		{name: "none cached: nothing to do"},
		{name: "ours: deleted", live: cm("u1", ours), cached: cm("u1", ours), wantDeleted: true},
		{name: "not ours: kept", live: cm("u1", nil), cached: cm("u1", nil), wantLive: true},
		{name: "another manager's label: kept", live: cm("u1", map[string]string{managedByLabel: "helm"}),
			cached: cm("u1", map[string]string{managedByLabel: "helm"}), wantLive: true},
		{name: "re-created since cached: the UID precondition keeps it", live: cm("u2", ours), cached: cm("u1", ours), wantLive: true},
		{name: "gone already", cached: cm("u1", ours)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			core := fake.NewClientset()
			if tt.live != nil {
				if err := core.Tracker().Add(tt.live); err != nil {
					t.Fatal(err)
				}
			}
			// The fake tracker ignores preconditions: check the one sent as
			// the API server does.
			core.PrependReactor("delete", "configmaps", func(a k8stesting.Action) (bool, runtime.Object, error) {
				da := a.(k8stesting.DeleteActionImpl)
				obj, err := core.Tracker().Get(a.GetResource(), da.GetNamespace(), da.GetName())
				if err != nil {
					return false, nil, nil
				}
				pre := da.GetDeleteOptions().Preconditions
				if pre == nil || pre.UID == nil {
					t.Error("delete without a UID precondition")
				} else if *pre.UID != obj.(*corev1.ConfigMap).UID {
					return true, nil, apierrors.NewConflict(a.GetResource().GroupResource(), da.GetName(), errors.New("UID precondition failed"))
				}
				return false, nil, nil
			})
			deleted, err := deleteKeyConfigMap(context.Background(), core, tt.cached)
			if err != nil {
				t.Fatal(err)
			}
			if deleted != tt.wantDeleted {
				t.Errorf("deleted = %v, want %v", deleted, tt.wantDeleted)
			}
			_, err = core.CoreV1().ConfigMaps("gone").Get(context.Background(), v1alpha1.AssignKeyConfigMap, metav1.GetOptions{})
			if live := err == nil; live != tt.wantLive {
				t.Errorf("ConfigMap live = %v (%v), want %v", live, err, tt.wantLive)
			}
		})
	}
}

// TestAssignKeyConfigMapFollowsNamespaces: the controller keeps the key
// ConfigMap where a pool or a Function is, and removes the one it made
// from a namespace that has neither; one it did not make stays.
func TestAssignKeyConfigMapFollowsNamespaces(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	e.add(poolDeploy("echo"))
	stale := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Namespace: "emptied", Name: v1alpha1.AssignKeyConfigMap, UID: "u-stale",
		Labels: map[string]string{managedByLabel: managedByValue},
	}}
	foreign := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "foreign", Name: v1alpha1.AssignKeyConfigMap, UID: "u-foreign"}}
	for _, cm := range []*corev1.ConfigMap{stale, foreign} {
		if _, err := e.core.CoreV1().ConfigMaps(cm.Namespace).Create(t.Context(), cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	startReplica(t, e, "ctl-0", nil, nil)
	get := func(ctx context.Context, ns string) error {
		_, err := e.core.CoreV1().ConfigMaps(ns).Get(ctx, v1alpha1.AssignKeyConfigMap, metav1.GetOptions{})
		return err
	}
	gone := func(ctx context.Context, ns string) error {
		if err := get(ctx, ns); !apierrors.IsNotFound(err) {
			return fmt.Errorf("get: %v, want NotFound", err)
		}
		return nil
	}
	poll.Until(t, pollTimeout, pollInterval, "the key ConfigMap in the pool's namespace", func(ctx context.Context) error { return get(ctx, "default") })
	poll.Until(t, pollTimeout, pollInterval, "the stale key ConfigMap removed", func(ctx context.Context) error { return gone(ctx, "emptied") })
	if err := get(t.Context(), "foreign"); err != nil {
		t.Errorf("a key ConfigMap the controller did not make: %v", err)
	}

	// The pool goes: so does its namespace's key.
	if err := e.core.AppsV1().Deployments("default").Delete(t.Context(), "echo", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, pollTimeout, pollInterval, "the key ConfigMap removed with the last pool", func(ctx context.Context) error { return gone(ctx, "default") })
}

// newTestAssignKey is a fresh signing key publishing only itself.
func newTestAssignKey(tb testing.TB) assignKey {
	tb.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	k, err := newAssignKey(priv, nil)
	if err != nil {
		tb.Fatal(err)
	}
	return k
}

// TestKeyFromSecret: the controller signs with ed25519.key and publishes
// its public key first, then the others in the Secret's ed25519.pub (a
// rotation's other key), each once; a Secret as the controller makes it
// publishes exactly what it did before key rotation existed.
func TestKeyFromSecret(t *testing.T) {
	t.Parallel()
	oldPub, oldPriv, _ := ed25519.GenerateKey(rand.Reader)
	newPub, newPriv, _ := ed25519.GenerateKey(rand.Reader)
	pubPEM := func(keys ...ed25519.PublicKey) []byte {
		var out []byte
		for _, k := range keys {
			out = append(out, pem(t, k)...)
		}
		return out
	}
	tests := []struct {
		name    string
		data    map[string][]byte
		sign    ed25519.PrivateKey
		publish []ed25519.PublicKey
		wantErr string
	}{
		{name: "as created", data: map[string][]byte{assignKeyPrivateKey: privPEM(t, oldPriv), assignKeyPublicKey: pubPEM(oldPub)},
			sign: oldPriv, publish: []ed25519.PublicKey{oldPub}},
		{name: "no public key", data: map[string][]byte{assignKeyPrivateKey: privPEM(t, oldPriv)},
			sign: oldPriv, publish: []ed25519.PublicKey{oldPub}},
		{name: "rotation: the next key published", data: map[string][]byte{assignKeyPrivateKey: privPEM(t, oldPriv), assignKeyPublicKey: pubPEM(oldPub, newPub)},
			sign: oldPriv, publish: []ed25519.PublicKey{oldPub, newPub}},
		{name: "rotation: signing with the next key", data: map[string][]byte{assignKeyPrivateKey: privPEM(t, newPriv), assignKeyPublicKey: pubPEM(oldPub, newPub)},
			sign: newPriv, publish: []ed25519.PublicKey{newPub, oldPub}},
		{name: "rotation: the old key dropped", data: map[string][]byte{assignKeyPrivateKey: privPEM(t, newPriv), assignKeyPublicKey: pubPEM(newPub)},
			sign: newPriv, publish: []ed25519.PublicKey{newPub}},
		{name: "the signing key's public key left out", data: map[string][]byte{assignKeyPrivateKey: privPEM(t, newPriv), assignKeyPublicKey: pubPEM(oldPub)},
			sign: newPriv, publish: []ed25519.PublicKey{newPub, oldPub}},
		{name: "a bad public key", data: map[string][]byte{assignKeyPrivateKey: privPEM(t, oldPriv), assignKeyPublicKey: append(pubPEM(oldPub), privPEM(t, newPriv)...)},
			wantErr: "key ed25519.pub: parse public key: PEM block 2"},
		{name: "no private key", data: map[string][]byte{assignKeyPublicKey: pubPEM(oldPub)}, wantErr: "key ed25519.key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, err := keyFromSecret(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: systemNS, Name: assignKeySecret}, Data: tt.data})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("keyFromSecret() error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !k.sign.Equal(tt.sign) {
				t.Error("signs with another key")
			}
			if diff := cmp.Diff(string(pubPEM(tt.publish...)), string(k.pubPEM)); diff != "" {
				t.Errorf("published (-want +got):\n%s", diff)
			}
		})
	}
}

// rotationEnv is a test env whose Secret skipper-assign-key signs with
// old, a Function in default (pool echo, pods p1..p3) and one in other,
// so both namespaces hold a key ConfigMap.
func rotationEnv(t *testing.T) (e *testEnv, secret *corev1.Secret, old ed25519.PrivateKey) {
	t.Helper()
	e = newTestEnv(t)
	secret, old = testKey(t)
	elsewhere := e.fnFor("elsewhere", "echo")
	elsewhere.Namespace = "other"
	e.add(secret, poolDeploy("echo"), e.fnFor("a", "echo"), e.fnFor("b", "echo"), elsewhere,
		poolPod("p1", "echo"), poolPod("p2", "echo"), poolPod("p3", "echo"))
	return e, secret, old
}

// setSecret writes data into the Secret, as an operator's patch does.
func (e *testEnv) setSecret(secret *corev1.Secret, data map[string][]byte) {
	e.t.Helper()
	s := secret.DeepCopy()
	s.Data = data
	if _, err := e.core.CoreV1().Secrets(systemNS).Update(e.t.Context(), s, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// published are the keys ConfigMap skipper-assign-key in ns holds.
func (e *testEnv) published(ns string) []ed25519.PublicKey {
	e.t.Helper()
	cm, err := e.core.CoreV1().ConfigMaps(ns).Get(e.t.Context(), v1alpha1.AssignKeyConfigMap, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	keys, _ := assign.ParsePublicKeys([]byte(cm.Data[v1alpha1.AssignKeyConfigMapKey]))
	return keys
}

// claimVerifies claims an instance of fn and checks the instance would
// accept its assign with exactly the keys pubs.
func claimVerifies(t *testing.T, e *testEnv, r *replica, fn string, sign ed25519.PublicKey, others ...ed25519.PublicKey) {
	t.Helper()
	if _, err := getInstance(t.Context(), r, fn, nil); err != nil {
		t.Fatalf("GetInstance %s: %v", fn, err)
	}
	reqs := e.assignRequests()
	last := reqs[len(reqs)-1]
	uid := tokenAudience(last.Token)
	if _, err := assign.VerifyRequest([]ed25519.PublicKey{sign}, last, uid, time.Now()); err != nil {
		t.Errorf("assign of %s: does not verify with the signing key: %v", fn, err)
	}
	if _, err := assign.VerifyRequest(others, last, uid, time.Now()); !errors.Is(err, assign.ErrSignature) {
		t.Errorf("assign of %s: verified by another key (%v)", fn, err)
	}
}

// TestAssignKeyRotation walks docs/operations.md's rotation with no
// restart: the replica reads the Secret again every --assign-key-interval,
// publishes the next key beside the current one, signs with it once the
// Secret says so, and drops the old one.
func TestAssignKeyRotation(t *testing.T) {
	t.Parallel()
	e, secret, old := rotationEnv(t)
	oldPub := old.Public().(ed25519.PublicKey)
	nextPub, next, _ := ed25519.GenerateKey(rand.Reader)
	oldPEM, nextPEM, nextKey := secret.Data[assignKeyPublicKey], pem(t, nextPub), privPEM(t, next)
	r := startReplica(t, e, "ctl-0", nil, func(c *Config) { c.AssignKeyInterval = 20 * time.Millisecond })
	claimVerifies(t, e, r, "a", oldPub, nextPub)

	steps := []struct {
		name string
		data map[string][]byte
		want []ed25519.PublicKey
	}{
		{"publish the next key", map[string][]byte{assignKeyPrivateKey: secret.Data[assignKeyPrivateKey], assignKeyPublicKey: append(slices.Clip(oldPEM), nextPEM...)},
			[]ed25519.PublicKey{oldPub, nextPub}},
		{"sign with it", map[string][]byte{assignKeyPrivateKey: nextKey, assignKeyPublicKey: append(slices.Clip(oldPEM), nextPEM...)},
			[]ed25519.PublicKey{nextPub, oldPub}},
		{"drop the old key", map[string][]byte{assignKeyPrivateKey: nextKey, assignKeyPublicKey: nextPEM},
			[]ed25519.PublicKey{nextPub}},
	}
	for _, s := range steps {
		e.setSecret(secret, s.data)
		for _, ns := range []string{"default", "other"} {
			poll.Until(t, pollTimeout, pollInterval, s.name+": ConfigMap "+ns, func(context.Context) error { return diff(s.want, e.published(ns)) })
		}
	}
	claimVerifies(t, e, r, "b", nextPub, oldPub)
}

// TestAssignKeyReadOnConfigMapChange: a replica that finds a key
// ConfigMap written otherwise than it would (by a replica that read the
// Secret later) reads the Secret before writing, and so agrees with it
// instead of writing its older view back; it then signs with the new key
// though its own interval has not come.
func TestAssignKeyReadOnConfigMapChange(t *testing.T) {
	t.Parallel()
	e, secret, old := rotationEnv(t)
	oldPub := old.Public().(ed25519.PublicKey)
	nextPub, next, _ := ed25519.GenerateKey(rand.Reader)
	r := startReplica(t, e, "ctl-0", nil, func(c *Config) { c.AssignKeyInterval = time.Hour })
	poll.Until(t, pollTimeout, pollInterval, "the key ConfigMaps", func(context.Context) error {
		if d, o := len(e.published("default")), len(e.published("other")); d != 1 || o != 1 {
			return fmt.Errorf("%d keys in default, %d in other, want 1 each", d, o)
		}
		return nil
	})

	both := append(pem(t, nextPub), secret.Data[assignKeyPublicKey]...)
	e.setSecret(secret, map[string][]byte{assignKeyPrivateKey: privPEM(t, next), assignKeyPublicKey: both})
	// Another replica, started after the change, publishes it in default.
	patch := fmt.Sprintf(`{"data":{%q:%q}}`, v1alpha1.AssignKeyConfigMapKey, both)
	if _, err := e.core.CoreV1().ConfigMaps("default").Patch(t.Context(), v1alpha1.AssignKeyConfigMap, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	want := []ed25519.PublicKey{nextPub, oldPub}
	poll.Until(t, pollTimeout, pollInterval, "the replica publishing the Secret's keys in other too", func(context.Context) error { return diff(want, e.published("other")) })
	if diff := cmp.Diff(want, e.published("default")); diff != "" {
		t.Errorf("ConfigMap default (-want +got):\n%s", diff)
	}
	claimVerifies(t, e, r, "a", nextPub, oldPub)
}

func pem(t *testing.T, k ed25519.PublicKey) []byte {
	t.Helper()
	b, err := assign.MarshalPublicKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func privPEM(t *testing.T, k ed25519.PrivateKey) []byte {
	t.Helper()
	b, err := assign.MarshalPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
