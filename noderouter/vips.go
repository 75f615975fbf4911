package noderouter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// serviceVIPs returns the steered destinations of svc: each IPv4 ClusterIP
// with each TCP port, sorted. A headless or ClusterIP-less Service has none.
func serviceVIPs(svc *corev1.Service) []netip.AddrPort {
	if svc == nil {
		return nil
	}
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	var out []netip.AddrPort
	for _, s := range ips {
		ip, err := netip.ParseAddr(s)
		if err != nil || !ip.Is4() { // "None", or IPv6 (connect6 steers v4-mapped only)
			continue
		}
		for _, p := range svc.Spec.Ports {
			if p.Protocol != "" && p.Protocol != corev1.ProtocolTCP {
				continue
			}
			if p.Port > 0 && p.Port <= 65535 {
				out = append(out, netip.AddrPortFrom(ip, uint16(p.Port)))
			}
		}
	}
	slices.SortFunc(out, func(a, b netip.AddrPort) int { return a.Compare(b) })
	return slices.Compact(out)
}

// watchServiceVIPs follows the router's own Service (namespace/name) until
// ctx ends, calling set with its VIPs after every change (nil once it is
// deleted, so nothing is steered to a Service that no longer exists).
func watchServiceVIPs(ctx context.Context, cs kubernetes.Interface, namespace, name string, log *slog.Logger, set func([]netip.AddrPort)) error {
	f := informers.NewSharedInformerFactoryWithOptions(cs, 0,
		informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			// One object: the Role grants list and watch of this name only.
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		}))
	inf := f.Core().V1().Services()
	var last []netip.AddrPort
	apply := func(svc *corev1.Service) {
		if svc != nil && svc.Name != name {
			return // the field selector already excludes it; a fake clientset does not
		}
		vips := serviceVIPs(svc)
		if slices.Equal(vips, last) && last != nil {
			return
		}
		last = vips
		if last == nil {
			last = []netip.AddrPort{}
		}
		log.Info("bpf VIPs from Service", "service", namespace+"/"+name, "vips", fmt.Sprint(vips))
		set(vips)
	}
	// Handlers run one at a time on the informer's goroutine.
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { svc, _ := obj.(*corev1.Service); apply(svc) },
		UpdateFunc: func(_, obj any) { svc, _ := obj.(*corev1.Service); apply(svc) },
		DeleteFunc: func(obj any) {
			if svc, ok := obj.(*corev1.Service); ok && svc.Name != name {
				return
			}
			apply(nil)
		},
	}); err != nil {
		return fmt.Errorf("service handler: %w", err)
	}
	f.Start(ctx.Done())
	defer f.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		if ctx.Err() != nil {
			return nil
		}
		return errors.New("service informer never synced")
	}
	<-ctx.Done()
	return nil
}
