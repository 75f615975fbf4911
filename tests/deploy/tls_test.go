package deploy

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// kustomize renders dir with kubectl (bin/kubectl of `make up`, else the
// one on PATH); the test is skipped without one.
func kustomize(t *testing.T, dir string) []byte {
	t.Helper()
	kubectl := filepath.Join(root, "bin", "kubectl")
	if _, err := exec.LookPath(kubectl); err != nil {
		if kubectl, err = exec.LookPath("kubectl"); err != nil {
			t.Skip("no kubectl in bin/ or on PATH to render kustomizations")
		}
	}
	var out, errb bytes.Buffer
	cmd := exec.Command(kubectl, "kustomize", filepath.Join(root, dir))
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, errb.String())
	}
	return out.Bytes()
}

// podSpec returns the pod template of the workload kind/name in rendered.
func podSpec(t *testing.T, rendered []byte, kind, name string) corev1.PodSpec {
	t.Helper()
	for doc := range strings.SplitSeq(string(rendered), "\n---\n") {
		var meta struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatal(err)
		}
		if meta.Kind != kind || meta.Metadata.Name != name {
			continue
		}
		switch kind {
		case "Deployment":
			var d appsv1.Deployment
			if err := yaml.Unmarshal([]byte(doc), &d); err != nil {
				t.Fatal(err)
			}
			return d.Spec.Template.Spec
		case "DaemonSet":
			var d appsv1.DaemonSet
			if err := yaml.Unmarshal([]byte(doc), &d); err != nil {
				t.Fatal(err)
			}
			return d.Spec.Template.Spec
		}
	}
	t.Fatalf("no %s %s rendered", kind, name)
	return corev1.PodSpec{}
}

// flagValue returns the value of --name=value in args.
func flagValue(args []string, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// The TLS overlay mounts Secret skipper-controller-tls where the
// controllers' --tls-dir points and only its ca.crt where the routers'
// --controller-tls-dir points; the default install has neither flag.
func TestTLSOverlay(t *testing.T) {
	const secret = "skipper-controller-tls"
	for _, tc := range []struct {
		kind, name, flag string
		items            []string // the Secret's keys mounted; nil: all
	}{
		{"Deployment", "skipper-controller", "tls-dir", nil},
		{"DaemonSet", "skipper-noderouter", "controller-tls-dir", []string{"ca.crt"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, ok := flagValue(podSpec(t, kustomize(t, "deploy"), tc.kind, tc.name).Containers[0].Args, tc.flag); ok {
				t.Errorf("deploy/ sets --%s: TLS must be off by default", tc.flag)
			}
			spec := podSpec(t, kustomize(t, "deploy/overlays/tls"), tc.kind, tc.name)
			c := spec.Containers[0]
			dir, ok := flagValue(c.Args, tc.flag)
			if !ok {
				t.Fatalf("overlays/tls: no --%s in %v", tc.flag, c.Args)
			}
			// Mounted runtime files live under /var/run, as the base's do.
			if !strings.HasPrefix(dir, "/var/run/") {
				t.Errorf("--%s=%s: want a path under /var/run", tc.flag, dir)
			}
			i := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == dir })
			if i < 0 {
				t.Fatalf("nothing mounted at --%s=%s: %v", tc.flag, dir, c.VolumeMounts)
			}
			if !c.VolumeMounts[i].ReadOnly {
				t.Errorf("mount at %s is writable", dir)
			}
			j := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == c.VolumeMounts[i].Name })
			if j < 0 || spec.Volumes[j].Secret == nil || spec.Volumes[j].Secret.SecretName != secret {
				t.Fatalf("volume mounted at %s is not Secret %s: %+v", dir, secret, spec.Volumes)
			}
			var items []string
			for _, it := range spec.Volumes[j].Secret.Items {
				if it.Key != it.Path {
					t.Errorf("Secret key %s mounted as %s: the flag reads it by its own name", it.Key, it.Path)
				}
				items = append(items, it.Key)
			}
			if !slices.Equal(items, tc.items) {
				t.Errorf("Secret keys mounted %v, want %v (nil: all)", items, tc.items)
			}
		})
	}
}
