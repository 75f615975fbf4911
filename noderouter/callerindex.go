package noderouter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/noderouter/callers"
)

// callerOf is a pod's entry in the caller index: its identity and the IPs
// calls from it come from. No IPs: it is not indexed (not started yet,
// finished, or on the host's network, whose address is the node's and
// names no one pod).
func callerOf(p *corev1.Pod) (callers.Identity, []netip.Addr) {
	sa := p.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	id := callers.NewIdentity(p.Namespace, sa, p.Name)
	if p.Spec.HostNetwork || p.DeletionTimestamp != nil && p.Status.Phase != corev1.PodRunning ||
		p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return id, nil
	}
	var ips []netip.Addr
	for _, s := range p.Status.PodIPs {
		if ip, err := netip.ParseAddr(s.IP); err == nil {
			ips = append(ips, ip)
		}
	}
	if len(ips) == 0 && p.Status.PodIP != "" {
		if ip, err := netip.ParseAddr(p.Status.PodIP); err == nil {
			ips = append(ips, ip)
		}
	}
	return id, ips
}

// slimPod keeps of a pod what callerOf and dataplane.PreconnectTo read, so that a
// router's cache of every pod in the cluster stays small (an informer
// transform).
func slimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // a tombstone: the informer's own
	}
	s := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID,
			ResourceVersion: p.ResourceVersion, DeletionTimestamp: p.DeletionTimestamp},
		Spec:   corev1.PodSpec{ServiceAccountName: p.Spec.ServiceAccountName, HostNetwork: p.Spec.HostNetwork},
		Status: corev1.PodStatus{Phase: p.Status.Phase, PodIP: p.Status.PodIP, PodIPs: p.Status.PodIPs},
	}
	if pool := p.Labels[v1alpha1.LabelPool]; pool != "" {
		// A pool pod's, for dataplane.PreconnectTo: the two labels,
		// readiness, the container ports and an HTTP readiness probe's
		// action (what an agent pool's pre-connection GETs).
		s.Labels = map[string]string{v1alpha1.LabelPool: pool}
		if fn, ok := p.Labels[v1alpha1.LabelFunction]; ok {
			s.Labels[v1alpha1.LabelFunction] = fn
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady {
				s.Status.Conditions = []corev1.PodCondition{{Type: c.Type, Status: c.Status}}
			}
		}
		for _, c := range p.Spec.Containers {
			sc := corev1.Container{Name: c.Name, Ports: c.Ports}
			if pr := c.ReadinessProbe; pr != nil && pr.HTTPGet != nil {
				sc.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: pr.HTTPGet}}
			}
			s.Spec.Containers = append(s.Spec.Containers, sc)
		}
		for _, c := range p.Spec.InitContainers {
			if len(c.Ports) > 0 {
				s.Spec.InitContainers = append(s.Spec.InitContainers, corev1.Container{Name: c.Name, Ports: c.Ports})
			}
		}
	}
	return s, nil
}

// podFeed takes the pod watch's pods: dataplane.Preconnector.
type podFeed interface {
	// Observe takes each pod event, without blocking.
	Observe(p *corev1.Pod, deleted bool)
	// SetList hands over the watch's cache, once synced.
	SetList(list func() []any)
}

// watchPods runs the router's watch of the cluster's pods until ctx ends,
// keeping idx (when not nil) in step and telling pre (when not nil) of
// every pod; synced is called once the first list is in.
func watchPods(ctx context.Context, cs kubernetes.Interface, idx *callers.Index, pre podFeed, log *slog.Logger, synced func()) error {
	f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithTransform(slimPod))
	inf := f.Core().V1().Pods().Informer()
	set := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok {
			return
		}
		if idx != nil {
			id, ips := callerOf(p)
			idx.Set(string(p.UID), id, ips)
		}
		if pre != nil {
			pre.Observe(p, false)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    set,
		UpdateFunc: func(_, obj any) { set(obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			p, ok := obj.(*corev1.Pod)
			if !ok {
				return
			}
			if idx != nil {
				idx.Delete(string(p.UID))
			}
			if pre != nil {
				pre.Observe(p, true)
			}
		},
	}); err != nil {
		return fmt.Errorf("pod handler: %w", err)
	}
	f.Start(ctx.Done())
	defer f.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		if ctx.Err() != nil {
			return nil
		}
		return errors.New("pod informer never synced")
	}
	if pre != nil {
		pre.SetList(inf.GetStore().List)
	}
	if idx != nil {
		log.Info("caller index synced", "ips", idx.Len())
	}
	synced()
	<-ctx.Done()
	return nil
}
