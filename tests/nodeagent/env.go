package nodeagent

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// objectGetter reads the ConfigMaps and Secrets pods refer to.
type objectGetter interface {
	ConfigMap(ctx context.Context, namespace, name string) (*corev1.ConfigMap, error)
	Secret(ctx context.Context, namespace, name string) (*corev1.Secret, error)
}

// podFacts are the values the downward API can expose that are not in the
// pod object yet (the agent assigns them).
type podFacts struct {
	PodIP, HostIP string
	// NodeCPUMilli and NodeMemory stand in for limits a container does not set.
	NodeCPUMilli int64
	NodeMemory   int64
	// APIServerHost and APIServerPort become KUBERNETES_SERVICE_HOST/PORT.
	APIServerHost string
	APIServerPort int
}

// ContainerEnv builds a container's environment and its expanded argv
// (command then args) as the kubelet does: service variables first, then
// envFrom, then env in order, each value expanded against what came before;
// command and args expanded against the result.
func ContainerEnv(ctx context.Context, get objectGetter, pod *corev1.Pod, c *corev1.Container, f podFacts) (env []string, argv []string, err error) {
	vars := map[string]string{}
	var order []string
	set := func(k, v string) {
		if _, ok := vars[k]; !ok {
			order = append(order, k)
		}
		vars[k] = v
	}
	port := strconv.Itoa(f.APIServerPort)
	set("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	set("HOSTNAME", pod.Name)
	set("KUBERNETES_SERVICE_HOST", f.APIServerHost)
	set("KUBERNETES_SERVICE_PORT", port)
	set("KUBERNETES_SERVICE_PORT_HTTPS", port)
	set("KUBERNETES_PORT", "tcp://"+f.APIServerHost+":"+port)
	set("KUBERNETES_PORT_"+port+"_TCP", "tcp://"+f.APIServerHost+":"+port)
	set("KUBERNETES_PORT_"+port+"_TCP_PROTO", "tcp")
	set("KUBERNETES_PORT_"+port+"_TCP_PORT", port)
	set("KUBERNETES_PORT_"+port+"_TCP_ADDR", f.APIServerHost)

	for _, from := range c.EnvFrom {
		var data map[string]string
		switch {
		case from.ConfigMapRef != nil:
			cm, err := get.ConfigMap(ctx, pod.Namespace, from.ConfigMapRef.Name)
			if err != nil {
				if optional(from.ConfigMapRef.Optional) && isNotFound(err) {
					continue
				}
				return nil, nil, fmt.Errorf("envFrom configmap %s: %w", from.ConfigMapRef.Name, err)
			}
			data = cm.Data
		case from.SecretRef != nil:
			s, err := get.Secret(ctx, pod.Namespace, from.SecretRef.Name)
			if err != nil {
				if optional(from.SecretRef.Optional) && isNotFound(err) {
					continue
				}
				return nil, nil, fmt.Errorf("envFrom secret %s: %w", from.SecretRef.Name, err)
			}
			data = map[string]string{}
			for k, v := range s.Data {
				data[k] = string(v)
			}
		}
		for _, k := range slices.Sorted(maps.Keys(data)) {
			set(from.Prefix+k, data[k])
		}
	}

	for _, e := range c.Env {
		if e.ValueFrom == nil {
			set(e.Name, Expand(e.Value, mapLookup(vars)))
			continue
		}
		v, ok, err := valueFrom(ctx, get, pod, c, e.ValueFrom, f)
		if err != nil {
			return nil, nil, fmt.Errorf("env %s: %w", e.Name, err)
		}
		if ok {
			set(e.Name, v)
		}
	}

	for _, k := range order {
		env = append(env, k+"="+vars[k])
	}
	for _, s := range c.Command {
		argv = append(argv, Expand(s, mapLookup(vars)))
	}
	for _, s := range c.Args {
		argv = append(argv, Expand(s, mapLookup(vars)))
	}
	return env, argv, nil
}

// valueFrom resolves one env source; ok is false for a missing optional key.
func valueFrom(ctx context.Context, get objectGetter, pod *corev1.Pod, c *corev1.Container, src *corev1.EnvVarSource, f podFacts) (string, bool, error) {
	switch {
	case src.FieldRef != nil:
		v, err := fieldValue(pod, src.FieldRef.FieldPath, f)
		return v, err == nil, err
	case src.ResourceFieldRef != nil:
		v, err := resourceValue(c, src.ResourceFieldRef, f)
		return v, err == nil, err
	case src.ConfigMapKeyRef != nil:
		ref := src.ConfigMapKeyRef
		cm, err := get.ConfigMap(ctx, pod.Namespace, ref.Name)
		if err != nil {
			if optional(ref.Optional) && isNotFound(err) {
				return "", false, nil
			}
			return "", false, fmt.Errorf("configmap %s: %w", ref.Name, err)
		}
		if v, ok := cm.Data[ref.Key]; ok {
			return v, true, nil
		}
		if v, ok := cm.BinaryData[ref.Key]; ok {
			return string(v), true, nil
		}
		if optional(ref.Optional) {
			return "", false, nil
		}
		return "", false, fmt.Errorf("configmap %s has no key %q", ref.Name, ref.Key)
	case src.SecretKeyRef != nil:
		ref := src.SecretKeyRef
		s, err := get.Secret(ctx, pod.Namespace, ref.Name)
		if err != nil {
			if optional(ref.Optional) && isNotFound(err) {
				return "", false, nil
			}
			return "", false, fmt.Errorf("secret %s: %w", ref.Name, err)
		}
		if v, ok := s.Data[ref.Key]; ok {
			return string(v), true, nil
		}
		if optional(ref.Optional) {
			return "", false, nil
		}
		return "", false, fmt.Errorf("secret %s has no key %q", ref.Name, ref.Key)
	}
	return "", false, fmt.Errorf("unsupported valueFrom")
}

// fieldValue resolves a downward-API field path.
func fieldValue(pod *corev1.Pod, path string, f podFacts) (string, error) {
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.podIP", "status.podIPs":
		return f.PodIP, nil
	case "status.hostIP", "status.hostIPs":
		return f.HostIP, nil
	case "metadata.labels":
		return formatMap(pod.Labels), nil
	case "metadata.annotations":
		return formatMap(pod.Annotations), nil
	}
	for prefix, m := range map[string]map[string]string{"metadata.labels": pod.Labels, "metadata.annotations": pod.Annotations} {
		if rest, ok := strings.CutPrefix(path, prefix+"['"); ok {
			if key, ok := strings.CutSuffix(rest, "']"); ok {
				return m[key], nil
			}
		}
	}
	return "", fmt.Errorf("unsupported fieldRef %q", path)
}

// formatMap renders labels or annotations as the downward API does.
func formatMap(m map[string]string) string {
	var lines []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		lines = append(lines, k+"="+strconv.Quote(m[k]))
	}
	return strings.Join(lines, "\n")
}

// resourceValue resolves a resourceFieldRef; an unset limit is the node's
// capacity, as the kubelet reports it.
func resourceValue(c *corev1.Container, ref *corev1.ResourceFieldSelector, f podFacts) (string, error) {
	divisor := ref.Divisor
	if divisor.IsZero() {
		divisor = resource.MustParse("1")
	}
	var q resource.Quantity
	var ok bool
	switch ref.Resource {
	case "limits.cpu":
		if q, ok = c.Resources.Limits[corev1.ResourceCPU]; !ok {
			q = *resource.NewMilliQuantity(f.NodeCPUMilli, resource.DecimalSI)
		}
		return strconv.FormatInt(int64(math.Ceil(float64(q.MilliValue())/float64(divisor.MilliValue()))), 10), nil
	case "requests.cpu":
		q = c.Resources.Requests[corev1.ResourceCPU]
		return strconv.FormatInt(int64(math.Ceil(float64(q.MilliValue())/float64(divisor.MilliValue()))), 10), nil
	case "limits.memory":
		if q, ok = c.Resources.Limits[corev1.ResourceMemory]; !ok {
			q = *resource.NewQuantity(f.NodeMemory, resource.BinarySI)
		}
		return strconv.FormatInt(int64(math.Ceil(float64(q.Value())/float64(divisor.Value()))), 10), nil
	case "requests.memory":
		q = c.Resources.Requests[corev1.ResourceMemory]
		return strconv.FormatInt(int64(math.Ceil(float64(q.Value())/float64(divisor.Value()))), 10), nil
	}
	return "", fmt.Errorf("unsupported resourceFieldRef %q", ref.Resource)
}

func optional(b *bool) bool { return b != nil && *b }
