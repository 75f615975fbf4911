package noderouter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"skipper.dev/skipper/controller/ring"
	"skipper.dev/skipper/internal/kubedial"
)

// kubeClient builds a clientset from kubeconfig, or in-cluster config when
// it is empty; its connects wait out an API server that refuses them
// (internal/kubedial) until ctx ends.
func kubeClient(ctx context.Context, kubeconfig string, log *slog.Logger) (kubernetes.Interface, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	cfg.UserAgent = "skipper-noderouter"
	cfg.Dial = kubedial.New(ctx, log.With("component", "kube-dial")).DialContext
	cfg.ContentType = runtime.ContentTypeProtobuf // built-in kinds only: cheaper for the API server
	cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return cs, nil
}

// watchMembers runs an EndpointSlice informer on the controllers' Service
// until ctx ends, calling set with the member list after every change and
// synced once the first list has been applied.
func watchMembers(ctx context.Context, cs kubernetes.Interface, namespace, service, portName string, log *slog.Logger, set func([]string), synced func()) error {
	f := informers.NewSharedInformerFactoryWithOptions(cs, 0,
		informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = labels.Set{discoveryv1.LabelServiceName: service}.String()
		}))
	inf := f.Discovery().V1().EndpointSlices()
	lister := inf.Lister()
	update := func() {
		list, err := lister.EndpointSlices(namespace).List(labels.Everything())
		if err != nil {
			log.Warn("list controller endpoint slices", "err", err)
			return
		}
		set(ring.MembersFromEndpointSlices(list, portName))
	}
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { update() },
		UpdateFunc: func(any, any) { update() },
		DeleteFunc: func(any) { update() },
	}); err != nil {
		return fmt.Errorf("endpoint slice handler: %w", err)
	}
	f.Start(ctx.Done())
	defer f.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		if ctx.Err() != nil {
			return nil
		}
		return errors.New("endpoint slice informer never synced")
	}
	update()
	synced()
	log.Info("watching controller endpoints", "namespace", namespace, "service", service)
	<-ctx.Done()
	return nil
}
