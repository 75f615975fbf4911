package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// errWaitingForObject marks a volume or env source that does not exist yet:
// the container waits and the agent retries, as the kubelet does.
var errWaitingForObject = errors.New("waiting for object")

func isNotFound(err error) bool { return apierrors.IsNotFound(err) }

// ResolveMountPath maps a container mount path to its place in the pod's
// private /run: /var/run/x → /run/x. Paths elsewhere are rejected: the pod
// shares the host's file system except for /run.
func ResolveMountPath(p string) (string, error) {
	if !path.IsAbs(p) {
		return "", fmt.Errorf("mount path %q is not absolute", p)
	}
	clean := path.Clean(p)
	if rest, ok := strings.CutPrefix(clean, "/var/run"); ok && (rest == "" || rest[0] == '/') {
		clean = "/run" + rest
	}
	if clean != "/run" && !strings.HasPrefix(clean, "/run/") {
		return "", fmt.Errorf("mount path %q is outside /run and /var/run: the skipper node agent gives pods a private /run only", p)
	}
	if clean == "/run" {
		return "", fmt.Errorf("mount path %q would cover the whole private /run", p)
	}
	return clean, nil
}

// volumeKind is how a mount is materialised.
type volumeKind int

const (
	volFiles    volumeKind = iota // files written into a directory
	volEmptyDir                   // an empty directory
	volNoop                       // hostPath whose path equals mountPath: the host's own
)

// mountPlan is one volume mount of a container, checked.
type mountPlan struct {
	Name   string
	Target string // resolved, under /run (empty for volNoop)
	Kind   volumeKind
	Volume *corev1.Volume
}

// PlanMounts checks a container's volume mounts against the pod's volumes;
// errors are permanent configuration errors for the pod status.
func PlanMounts(pod *corev1.Pod, c *corev1.Container) ([]mountPlan, error) {
	vols := map[string]*corev1.Volume{}
	for i := range pod.Spec.Volumes {
		vols[pod.Spec.Volumes[i].Name] = &pod.Spec.Volumes[i]
	}
	var plans []mountPlan
	for _, m := range c.VolumeMounts {
		v, ok := vols[m.Name]
		if !ok {
			return nil, fmt.Errorf("volume mount %q: no such volume", m.Name)
		}
		if m.SubPath != "" || m.SubPathExpr != "" {
			return nil, fmt.Errorf("volume mount %q: subPath is not supported by the skipper node agent", m.Name)
		}
		if v.HostPath != nil {
			if path.Clean(v.HostPath.Path) != path.Clean(m.MountPath) {
				return nil, fmt.Errorf("volume %q: hostPath %q mounted at %q: only hostPath volumes mounted at their own path are supported", v.Name, v.HostPath.Path, m.MountPath)
			}
			plans = append(plans, mountPlan{Name: m.Name, Kind: volNoop, Volume: v})
			continue
		}
		target, err := ResolveMountPath(m.MountPath)
		if err != nil {
			return nil, fmt.Errorf("volume mount %q: %w", m.Name, err)
		}
		switch {
		case v.EmptyDir != nil:
			plans = append(plans, mountPlan{Name: m.Name, Target: target, Kind: volEmptyDir, Volume: v})
		case v.ConfigMap != nil, v.Secret != nil, v.Projected != nil, v.DownwardAPI != nil:
			plans = append(plans, mountPlan{Name: m.Name, Target: target, Kind: volFiles, Volume: v})
		default:
			return nil, fmt.Errorf("volume %q: only configMap, secret, projected, downwardAPI, emptyDir and same-path hostPath volumes are supported", v.Name)
		}
	}
	return plans, nil
}

// tokenSource returns a service-account token for the pod, bound to it, for
// audience (empty: the API server's) and the requested lifetime.
type tokenSource interface {
	Token(ctx context.Context, pod *corev1.Pod, audience string, expirationSeconds int64) (string, error)
}

// volumeFiles computes the files (relative path → content) of a files volume.
func volumeFiles(ctx context.Context, get objectGetter, tokens tokenSource, pod *corev1.Pod, v *corev1.Volume, f podFacts) (map[string][]byte, error) {
	files := map[string][]byte{}
	switch {
	case v.ConfigMap != nil:
		return files, addConfigMap(ctx, get, pod, files, v.ConfigMap.Name, v.ConfigMap.Items, v.ConfigMap.Optional)
	case v.Secret != nil:
		return files, addSecret(ctx, get, pod, files, v.Secret.SecretName, v.Secret.Items, v.Secret.Optional)
	case v.DownwardAPI != nil:
		return files, addDownward(pod, files, v.DownwardAPI.Items, f)
	case v.Projected != nil:
		for _, src := range v.Projected.Sources {
			var err error
			switch {
			case src.ConfigMap != nil:
				err = addConfigMap(ctx, get, pod, files, src.ConfigMap.Name, src.ConfigMap.Items, src.ConfigMap.Optional)
			case src.Secret != nil:
				err = addSecret(ctx, get, pod, files, src.Secret.Name, src.Secret.Items, src.Secret.Optional)
			case src.DownwardAPI != nil:
				err = addDownward(pod, files, src.DownwardAPI.Items, f)
			case src.ServiceAccountToken != nil:
				sat := src.ServiceAccountToken
				exp := int64(3600)
				if sat.ExpirationSeconds != nil {
					exp = *sat.ExpirationSeconds
				}
				var tok string
				tok, err = tokens.Token(ctx, pod, sat.Audience, exp)
				if err == nil {
					files[sat.Path] = []byte(tok)
				}
			default:
				err = fmt.Errorf("unsupported projected source in volume %q", v.Name)
			}
			if err != nil {
				return nil, err
			}
		}
		return files, nil
	}
	return nil, fmt.Errorf("volume %q has no files", v.Name)
}

func addConfigMap(ctx context.Context, get objectGetter, pod *corev1.Pod, files map[string][]byte, name string, items []corev1.KeyToPath, opt *bool) error {
	cm, err := get.ConfigMap(ctx, pod.Namespace, name)
	if err != nil {
		if isNotFound(err) {
			if optional(opt) {
				return nil
			}
			return fmt.Errorf("%w: configmap %s/%s not found", errWaitingForObject, pod.Namespace, name)
		}
		return fmt.Errorf("configmap %s/%s: %w", pod.Namespace, name, err)
	}
	data := map[string][]byte{}
	for k, v := range cm.Data {
		data[k] = []byte(v)
	}
	for k, v := range cm.BinaryData {
		data[k] = v
	}
	return addItems(files, "configmap "+pod.Namespace+"/"+name, data, items, opt)
}

func addSecret(ctx context.Context, get objectGetter, pod *corev1.Pod, files map[string][]byte, name string, items []corev1.KeyToPath, opt *bool) error {
	s, err := get.Secret(ctx, pod.Namespace, name)
	if err != nil {
		if isNotFound(err) {
			if optional(opt) {
				return nil
			}
			return fmt.Errorf("%w: secret %s/%s not found", errWaitingForObject, pod.Namespace, name)
		}
		return fmt.Errorf("secret %s/%s: %w", pod.Namespace, name, err)
	}
	return addItems(files, "secret "+pod.Namespace+"/"+name, s.Data, items, opt)
}

func addItems(files map[string][]byte, what string, data map[string][]byte, items []corev1.KeyToPath, opt *bool) error {
	if len(items) == 0 {
		for k, v := range data {
			files[k] = v
		}
		return nil
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			if optional(opt) {
				continue
			}
			return fmt.Errorf("%w: %s has no key %q", errWaitingForObject, what, it.Key)
		}
		files[it.Path] = v
	}
	return nil
}

func addDownward(pod *corev1.Pod, files map[string][]byte, items []corev1.DownwardAPIVolumeFile, f podFacts) error {
	for _, it := range items {
		switch {
		case it.FieldRef != nil:
			v, err := fieldValue(pod, it.FieldRef.FieldPath, f)
			if err != nil {
				return err
			}
			files[it.Path] = []byte(v)
		case it.ResourceFieldRef != nil:
			var c *corev1.Container
			for i := range pod.Spec.Containers {
				if pod.Spec.Containers[i].Name == it.ResourceFieldRef.ContainerName {
					c = &pod.Spec.Containers[i]
				}
			}
			if c == nil && len(pod.Spec.Containers) > 0 {
				c = &pod.Spec.Containers[0]
			}
			v, err := resourceValue(c, it.ResourceFieldRef, f)
			if err != nil {
				return err
			}
			files[it.Path] = []byte(v)
		}
	}
	return nil
}

// writeVolume writes files under root/target, replacing each file
// atomically (readers see the old or the new content, never a mix) and
// removing files the volume no longer has.
func writeVolume(root, target string, files map[string][]byte) error {
	dir := filepath.Join(root, target)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("volume dir %s: %w", target, err)
	}
	keep := map[string]bool{}
	for rel, data := range files {
		clean := path.Clean("/" + rel)[1:]
		if clean == "" {
			return fmt.Errorf("volume file %q names no file in %s", rel, target)
		}
		keep[clean] = true
		p := filepath.Join(dir, clean)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("volume file %s: %w", p, err)
		}
		tmp := fmt.Sprintf("%s.%d.tmp", p, time.Now().UnixNano())
		if err := os.WriteFile(tmp, data, 0o644); err != nil {
			return fmt.Errorf("volume file %s: %w", path.Join(target, clean), err)
		}
		if err := os.Rename(tmp, p); err != nil {
			os.Remove(tmp)
			return fmt.Errorf("volume file %s: %w", path.Join(target, clean), err)
		}
	}
	// Drop files a ConfigMap or Secret no longer holds.
	return filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if !keep[filepath.ToSlash(rel)] {
			return os.Remove(p)
		}
		return nil
	})
}
