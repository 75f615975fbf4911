package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	"skipper.dev/skipper/controller/api/v1alpha1"
)

// A Function's own Service: an ExternalName Service of the Function's name
// in its namespace, owned by it, naming the routers' Service
// (--router-service). A caller's http://<name>.<namespace>.svc then
// resolves, through the cluster DNS, to the routers' ClusterIP, which BPF
// steering sends to the caller's own node's router; the router reads the
// function from the Host (route.Hosts). The owner replica keeps it
// (svcQueue); the garbage collector deletes it with the Function. A
// Service of that name Skipper does not own is left alone and reported:
// condition ServiceReady False, reason ServiceNameTaken, and a Warning
// Event.

// Condition ServiceReady and its reasons; reasonServiceNameTaken is also
// the Warning Event's reason.
const (
	conditionServiceReady    = "ServiceReady"
	reasonServiceReady       = "ServiceReady"
	reasonServiceNameTaken   = "ServiceNameTaken"
	reasonInvalidServiceName = "InvalidServiceName"
)

// serviceTarget is the name a Function's Service points at:
// <router-service>.<pod-namespace>.svc.<cluster-domain>; "" when
// --router-service is empty (no Services).
func (c Config) serviceTarget() string {
	if c.RouterService == "" {
		return ""
	}
	return c.RouterService + "." + c.PodNamespace + ".svc." + c.ClusterDomain
}

// functionService is the Service fn wants, naming target.
func functionService(fn *v1alpha1.Function, target string) *corev1.Service {
	ref := functionOwnerRef(fn)
	t := true
	ref.Controller = &t
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Name: fn.Name, Namespace: fn.Namespace,
			Labels:          map[string]string{"app.kubernetes.io/managed-by": "skipper-controller"},
			OwnerReferences: []metav1.OwnerReference{ref},
		},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: target},
	}
}

// serviceAction is what the owner does about a Function's Service.
type serviceAction int

const (
	serviceKeep   serviceAction = iota // it is as wanted
	serviceCreate                      // there is none
	servicePatch                       // it is the Function's, naming something else
	serviceTaken                       // it is not the Function's: left alone, reported
	serviceWait                        // it is a deleted Function's of the same name, which the garbage collector removes
	serviceNoName                      // the Function's name is no Service name (one made before the CRD refused them)
)

// decideService decides about fn's Service, have (nil: none), wanted to
// name target. For serviceTaken, msg says whose it is.
func decideService(fn *v1alpha1.Function, have *corev1.Service, target string) (a serviceAction, msg string) {
	if errs := validation.IsDNS1035Label(fn.Name); len(errs) > 0 {
		return serviceNoName, fmt.Sprintf("%q is not a Service name (%s): callers reach the function with x-skipper-function or Host: %s.%s.fn only",
			fn.Name, strings.Join(errs, "; "), fn.Name, fn.Namespace)
	}
	if have == nil {
		return serviceCreate, ""
	}
	ref := metav1.GetControllerOfNoCopy(have)
	switch {
	case ref != nil && ref.UID == fn.UID && ref.Kind == functionKind:
		if have.Spec.Type != corev1.ServiceTypeExternalName || have.Spec.ExternalName != target {
			return servicePatch, ""
		}
		return serviceKeep, ""
	case ref != nil && ref.Kind == functionKind && ref.APIVersion == v1alpha1.SchemeGroupVersion.String() && ref.Name == fn.Name:
		return serviceWait, ""
	}
	owner := "no owner"
	if ref != nil {
		owner = "owner " + ref.Kind + " " + ref.Name
	}
	return serviceTaken, fmt.Sprintf("Service %s/%s exists and is not this Function's (%s): callers cannot reach the function as http://%s.%s.svc; rename the Function or remove that Service",
		fn.Namespace, fn.Name, owner, fn.Name, fn.Namespace)
}

// serviceState is what the owner last found of a Function's Service, for
// its status: ok, or why not.
type serviceState struct {
	ok          bool
	reason, msg string // when not ok
}

// errServiceWait: a deleted Function's Service of the same name is still
// there; the sync is retried (with the queue's backoff) until the garbage
// collector removed it.
var errServiceWait = errors.New("the Service of a deleted Function of the same name is still being removed")

// syncService keeps the Service of the function key, when this replica
// owns it and --router-service is set.
func (c *controller) syncService(ctx context.Context, key string) error {
	target := c.cfg.serviceTarget()
	if target == "" {
		return nil
	}
	ns, name, _ := splitKey(key)
	fn, inv, err := c.cache.lookup(ns, name)
	if err != nil || inv != nil || fn.DeletionTimestamp != nil || !c.owns(key) {
		return nil // gone (its Service goes with it), invalid (reported as such) or not this replica's
	}
	have := c.cache.service(ns, name)
	a, msg := decideService(fn, have, target)
	switch a {
	case serviceWait:
		return fmt.Errorf("service %s: %w", key, errServiceWait)
	case serviceCreate:
		_, err := c.core.CoreV1().Services(ns).Create(ctx, functionService(fn, target), metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			// The informer has not shown it yet (ours, or someone
			// else's): its event brings another sync, which decides.
			return nil
		}
		if err != nil {
			return fmt.Errorf("create service %s: %w", key, err)
		}
		c.log.Info("created the function's Service", "function", key, "external_name", target)
	case servicePatch:
		patch, err := json.Marshal(map[string]any{
			"metadata": map[string]any{"resourceVersion": have.ResourceVersion},
			"spec":     map[string]any{"type": corev1.ServiceTypeExternalName, "externalName": target, "clusterIP": nil, "clusterIPs": nil},
		})
		if err != nil {
			return err
		}
		if _, err := c.core.CoreV1().Services(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("patch service %s: %w", key, err)
		}
		c.log.Info("pointed the function's Service at the routers", "function", key, "external_name", target)
	case serviceTaken:
		if c.setServiceState(key, serviceState{reason: reasonServiceNameTaken, msg: msg}) {
			c.event(fn, corev1.EventTypeWarning, reasonServiceNameTaken, "%s", msg)
		}
		return nil
	case serviceNoName:
		c.setServiceState(key, serviceState{reason: reasonInvalidServiceName, msg: msg})
		return nil
	}
	c.setServiceState(key, serviceState{ok: true})
	return nil
}

// setServiceState records st for key and, when it changed, has the
// function's status written again (syncFunction, or its supervisor's next
// tick). It reports whether st changed.
func (c *controller) setServiceState(key string, st serviceState) bool {
	c.mu.Lock()
	old, had := c.svcStates[key]
	changed := !had || old != st
	c.svcStates[key] = st
	c.mu.Unlock()
	if changed {
		c.fnQueue.Add(key)
	}
	return changed
}

// serviceStateOf is what syncService last found for key (nil: it has not
// decided, or makes no Services).
func (c *controller) serviceStateOf(key string) *serviceState {
	c.mu.Lock()
	defer c.mu.Unlock()
	st, ok := c.svcStates[key]
	if !ok {
		return nil
	}
	return &st
}
