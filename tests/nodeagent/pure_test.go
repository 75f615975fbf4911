package nodeagent

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
)

func TestExpand(t *testing.T) {
	vars := map[string]string{"POD_IP": "198.18.1.2", "PORT": "8080", "EMPTY": ""}
	tests := []struct {
		name, in, want string
	}{
		{"plain", "--listen=:80", "--listen=:80"},
		{"one var", "$(POD_IP):$(PORT)", "198.18.1.2:8080"},
		{"undefined kept", "$(NOPE)", "$(NOPE)"},
		{"escaped", "$$(POD_IP)", "$(POD_IP)"},
		{"double dollar", "a$$b", "a$b"},
		{"lone dollar", "cost $5", "cost $5"},
		{"trailing dollar", "x$", "x$"},
		{"unterminated", "$(POD_IP", "$(POD_IP"},
		{"empty value", "[$(EMPTY)]", "[]"},
		{"empty name", "$()", "$()"},
		{"adjacent", "$(PORT)$(PORT)", "80808080"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, Expand(tt.in, mapLookup(vars))); diff != "" {
				t.Errorf("Expand(%q) (-want +got):\n%s", tt.in, diff)
			}
		})
	}
}

func TestIPAM(t *testing.T) {
	a, err := NewIPAM(netip.MustParsePrefix("198.18.1.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	ip1, _ := a.Allocate("a")
	ip2, _ := a.Allocate("b")
	again, _ := a.Allocate("a")
	if diff := cmp.Diff([]string{"198.18.1.2", "198.18.1.3", "198.18.1.2"}, []string{ip1.String(), ip2.String(), again.String()}); diff != "" {
		t.Errorf("allocations (-want +got):\n%s", diff)
	}
	a.Release("a")
	ip3, _ := a.Allocate("c")
	if ip3.String() != "198.18.1.4" {
		t.Errorf("after release got %s, want 198.18.1.4 (no immediate reuse)", ip3)
	}
	if err := a.Claim("d", netip.MustParseAddr("198.18.1.3")); err == nil {
		t.Errorf("claim of a taken address succeeded")
	}
	if err := a.Claim("d", netip.MustParseAddr("198.18.2.3")); err == nil {
		t.Errorf("claim outside the CIDR succeeded")
	}
	if err := a.Claim("d", netip.MustParseAddr("198.18.1.255")); err == nil {
		t.Errorf("claim of the broadcast address succeeded")
	}
	if err := a.Claim("d", netip.MustParseAddr("198.18.1.77")); err != nil {
		t.Errorf("claim: %v", err)
	}

	small, _ := NewIPAM(netip.MustParsePrefix("198.18.9.0/29")) // .2-.6 usable
	seen := map[string]bool{}
	for i := range 5 {
		ip, err := small.Allocate(string(rune('a' + i)))
		if err != nil {
			t.Fatalf("allocate %d: %v", i, err)
		}
		seen[ip.String()] = true
	}
	if _, err := small.Allocate("z"); !errors.Is(err, ErrPodCIDRFull) {
		t.Errorf("full CIDR: got %v, want ErrPodCIDRFull", err)
	}
	for _, bad := range []string{"198.18.9.0", "198.18.9.1", "198.18.9.7"} {
		if seen[bad] {
			t.Errorf("allocated reserved address %s", bad)
		}
	}
}

func TestImageMap(t *testing.T) {
	m := ImageMap{}
	if err := m.ParseImageDir("ghcr.io/skipper-dev/skipper=/work/main/bin"); err != nil {
		t.Fatal(err)
	}
	if err := m.ParseImageDir("localhost:5000/x:v1=/opt/x"); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"nodir", "img=relative/dir", "=/abs"} {
		if err := m.ParseImageDir(bad); err == nil {
			t.Errorf("ParseImageDir(%q): want an error", bad)
		}
	}
	tests := []struct {
		name    string
		image   string
		command []string
		args    []string
		want    string
		wantErr bool
	}{
		{"tag", "ghcr.io/skipper-dev/skipper:v0.1.0", []string{"/skipper-echo"}, nil, "/work/main/bin/skipper-echo", false},
		{"no tag", "ghcr.io/skipper-dev/skipper", []string{"/usr/bin/skipper-controller", "--x"}, nil, "/work/main/bin/skipper-controller", false},
		{"digest", "ghcr.io/skipper-dev/skipper@sha256:abc", []string{"skipper-noderouter"}, nil, "/work/main/bin/skipper-noderouter", false},
		{"args only", "ghcr.io/skipper-dev/skipper:latest", nil, []string{"/skipper-echo"}, "/work/main/bin/skipper-echo", false},
		{"registry port", "localhost:5000/x:v2", []string{"/run-me"}, nil, "/opt/x/run-me", false},
		{"unmapped", "docker.io/library/nginx:1", []string{"nginx"}, nil, "", true},
		{"no command", "ghcr.io/skipper-dev/skipper", nil, nil, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := m.Resolve(tt.image, tt.command, tt.args)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	if _, err := m.Resolve("nginx", []string{"x"}, nil); !errors.Is(err, ErrImageNotMapped) {
		t.Errorf("unmapped: got %v, want ErrImageNotMapped", err)
	}
}

// fakeObjects is an in-memory objectGetter.
type fakeObjects struct {
	cms     map[string]*corev1.ConfigMap
	secrets map[string]*corev1.Secret
}

func (f fakeObjects) ConfigMap(_ context.Context, ns, name string) (*corev1.ConfigMap, error) {
	if cm, ok := f.cms[ns+"/"+name]; ok {
		return cm, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "configmaps"}, name)
}

func (f fakeObjects) Secret(_ context.Context, ns, name string) (*corev1.Secret, error) {
	if s, ok := f.secrets[ns+"/"+name]; ok {
		return s, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, name)
}

func TestContainerEnv(t *testing.T) {
	objs := fakeObjects{
		cms:     map[string]*corev1.ConfigMap{"ns/cfg": {Data: map[string]string{"mode": "fast", "level": "debug"}}},
		secrets: map[string]*corev1.Secret{"ns/sec": {Data: map[string][]byte{"key": []byte("s3cret")}}},
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u-1", Labels: map[string]string{"app": "x"}},
		Spec:       corev1.PodSpec{NodeName: "node1", ServiceAccountName: "sa"},
	}
	c := &corev1.Container{
		Name:    "main",
		Command: []string{"/skipper-echo", "--listen=$(POD_IP):$(PORT)"},
		Args:    []string{"--mode=$(MODE)", "$$(POD_IP)", "$(UNDEFINED)"},
		EnvFrom: []corev1.EnvFromSource{{Prefix: "CFG_", ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}}}},
		Env: []corev1.EnvVar{
			{Name: "PORT", Value: "8080"},
			{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
			{Name: "NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
			{Name: "NS", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
			{Name: "UID", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.uid"}}},
			{Name: "NODE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
			{Name: "SA", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.serviceAccountName"}}},
			{Name: "HOST_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.hostIP"}}},
			{Name: "APP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['app']"}}},
			{Name: "MODE", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}, Key: "mode"}}},
			{Name: "KEY", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "sec"}, Key: "key"}}},
			{Name: "OPT", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "missing"}, Key: "k", Optional: ptr.To(true)}}},
			{Name: "ADDR", Value: "http://$(POD_IP):$(PORT)"},
			{Name: "CPUS", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.cpu"}}},
			{Name: "MEM_MI", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.memory", Divisor: resource.MustParse("1Mi")}}},
		},
	}
	f := podFacts{PodIP: "198.18.1.5", HostIP: "198.51.100.11", NodeCPUMilli: 2000, NodeMemory: 1 << 30, APIServerHost: "198.51.100.1", APIServerPort: 6443}
	env, argv, err := ContainerEnv(context.Background(), objs, pod, c, f)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, kv := range env {
		for i := range kv {
			if kv[i] == '=' {
				got[kv[:i]] = kv[i+1:]
				break
			}
		}
	}
	want := map[string]string{
		"KUBERNETES_SERVICE_HOST": "198.51.100.1", "KUBERNETES_SERVICE_PORT": "6443",
		"CFG_mode": "fast", "CFG_level": "debug",
		"PORT": "8080", "POD_IP": "198.18.1.5", "NAME": "p", "NS": "ns", "UID": "u-1", "NODE": "node1", "SA": "sa",
		"HOST_IP": "198.51.100.11", "APP": "x", "MODE": "fast", "KEY": "s3cret", "ADDR": "http://198.18.1.5:8080",
		"CPUS": "2", "MEM_MI": "1024", "HOSTNAME": "p",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("env %s = %q, want %q", k, got[k], v)
		}
	}
	if _, ok := got["OPT"]; ok {
		t.Errorf("optional missing configmap key set OPT")
	}
	wantArgv := []string{"/skipper-echo", "--listen=198.18.1.5:8080", "--mode=fast", "$(POD_IP)", "$(UNDEFINED)"}
	if diff := cmp.Diff(wantArgv, argv); diff != "" {
		t.Errorf("argv (-want +got):\n%s", diff)
	}

	c.Env = append(c.Env, corev1.EnvVar{Name: "X", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "missing"}, Key: "k"}}})
	if _, _, err := ContainerEnv(context.Background(), objs, pod, c, f); err == nil {
		t.Errorf("missing required configmap: want an error")
	}
}

func TestResolveMountPath(t *testing.T) {
	tests := []struct {
		in, want string
		wantErr  bool
	}{
		{"/var/run/secrets/kubernetes.io/serviceaccount", "/run/secrets/kubernetes.io/serviceaccount", false},
		{"/run/skipper/assign-key", "/run/skipper/assign-key", false},
		{"/var/run/../run/x", "/run/x", false},
		{"/etc/config", "", true},
		{"/var/runner", "", true},
		{"/run", "", true},
		{"relative", "", true},
		{"/run/../etc", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ResolveMountPath(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

type fakeTokens struct{}

func (fakeTokens) Token(_ context.Context, pod *corev1.Pod, aud string, exp int64) (string, error) {
	return "token-for-" + pod.Name + "-" + aud, nil
}

func TestVolumeFilesProjectedServiceAccount(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}}
	objs := fakeObjects{cms: map[string]*corev1.ConfigMap{"ns/kube-root-ca.crt": {Data: map[string]string{"ca.crt": "PEM"}}}}
	vol := &corev1.Volume{Name: "kube-api-access-x", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
		{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To(int64(3607))}},
		{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"}, Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
		{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}}}},
	}}}}
	files, err := volumeFiles(context.Background(), objs, fakeTokens{}, pod, vol, podFacts{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for k, v := range files {
		got[k] = string(v)
	}
	want := map[string]string{"token": "token-for-p-", "ca.crt": "PEM", "namespace": "ns"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("files (-want +got):\n%s", diff)
	}

	missing := &corev1.Volume{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "skipper-assign-key"}}}}
	if _, err := volumeFiles(context.Background(), objs, fakeTokens{}, pod, missing, podFacts{}); !errors.Is(err, errWaitingForObject) {
		t.Errorf("missing configmap: got %v, want errWaitingForObject", err)
	}
	missing.ConfigMap.Optional = ptr.To(true)
	if files, err := volumeFiles(context.Background(), objs, fakeTokens{}, pod, missing, podFacts{}); err != nil || len(files) != 0 {
		t.Errorf("optional missing configmap: got %v, %v; want no files", files, err)
	}
}

func TestPlanMounts(t *testing.T) {
	pod := &corev1.Pod{Spec: corev1.PodSpec{Volumes: []corev1.Volume{
		{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{}}},
		{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		{Name: "cg", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/sys/fs/cgroup"}}},
		{Name: "pvc", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "x"}}},
	}}}
	tests := []struct {
		name    string
		mounts  []corev1.VolumeMount
		want    []string
		wantErr bool
	}{
		{"ok", []corev1.VolumeMount{{Name: "cfg", MountPath: "/var/run/skipper/cfg"}, {Name: "tmp", MountPath: "/run/tmp"}, {Name: "cg", MountPath: "/sys/fs/cgroup"}},
			[]string{"/run/skipper/cfg", "/run/tmp", ""}, false},
		{"outside run", []corev1.VolumeMount{{Name: "cfg", MountPath: "/etc/cfg"}}, nil, true},
		{"hostPath elsewhere", []corev1.VolumeMount{{Name: "cg", MountPath: "/run/cg"}}, nil, true},
		{"unsupported kind", []corev1.VolumeMount{{Name: "pvc", MountPath: "/run/data"}}, nil, true},
		{"subPath", []corev1.VolumeMount{{Name: "cfg", MountPath: "/run/x", SubPath: "a"}}, nil, true},
		{"unknown volume", []corev1.VolumeMount{{Name: "nope", MountPath: "/run/x"}}, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			plans, err := PlanMounts(pod, &corev1.Container{VolumeMounts: tt.mounts})
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			var got []string
			for _, p := range plans {
				got = append(got, p.Target)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("targets (-want +got):\n%s", diff)
			}
		})
	}
}
