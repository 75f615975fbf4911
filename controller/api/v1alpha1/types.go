package v1alpha1

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Group and version of the API.
const (
	Group   = "skipper.dev"
	Version = "v1alpha1"
)

// Labels and annotations that make up the pool contract.
const (
	// LabelPool names the pool a Deployment and its pods belong to.
	LabelPool = "skipper.dev/pool"
	// LabelFunction marks a claimed pod with the name of its Function.
	LabelFunction = "skipper.dev/function"
	// AnnotationAutoscale opts a pool Deployment in to the pool autoscaler.
	AnnotationAutoscale = "skipper.dev/autoscale"
	// AnnotationContract, ContractSelf on a pool pod, says its image serves
	// the instance contract itself (skipper-echo): the admission policy
	// skipper-agent adds no agent (deploy/base/agent-injection.yaml).
	AnnotationContract = "skipper.dev/contract"
	ContractSelf       = "self"
	// AssignKeyConfigMap is the ConfigMap holding the assign public key in every
	// namespace with a pool or a Function.
	AssignKeyConfigMap = "skipper-assign-key"
	// AssignKeyConfigMapKey is the key of the PEM public key in AssignKeyConfigMap.
	AssignKeyConfigMapKey = "ed25519.pub"
)

// Defaults the CRD schema applies; the accessors apply them too.
const (
	DefaultTargetInFlight = 10
	DefaultIdleTimeout    = 60 * time.Second
)

// Bounds the CRD schema enforces (the kubebuilder markers below repeat
// them: markers cannot name constants, and a test checks the generated CRD
// against these). The controller checks them again on every Function it
// reads, so an object stored past the API server's validation is reported
// rather than acted on. Each field's doc comment says why its bound is
// where it is.
const (
	MaxNameLength        = 63
	MaxMinInstances      = 1000
	MaxMaxInstances      = 1000
	MaxConcurrencyLimit  = 10000
	MaxTargetInFlight    = 10000
	MaxTargetCPUMilli    = 1000000
	MaxTargetMemoryMiB   = 1048576
	MaxMaxBodyBytes      = 1 << 40
	MinIdleTimeout       = time.Second
	MaxIdleTimeout       = 24 * time.Hour
	MinTimeout           = time.Millisecond
	MaxTimeout           = time.Hour
	MaxDurationLength    = 64
	MaxConfigEntries     = 64
	MaxConfigKeyLength   = 253
	MaxConfigValueLength = 4096
	MaxCallers           = 64
)

// SchemeGroupVersion is the group version used to register these objects.
var SchemeGroupVersion = schema.GroupVersion{Group: Group, Version: Version}

// Resource is the Function resource's GroupVersionResource.
var Resource = SchemeGroupVersion.WithResource("functions")

// AddToScheme registers Function and FunctionList.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(SchemeGroupVersion, &Function{}, &FunctionList{})
	metav1.AddToGroupVersion(s, SchemeGroupVersion)
	return nil
}

// Function is a serverless function served from a pool of pre-warmed pods.
//
// Its name is the value of the label skipper.dev/function on its instances,
// so it must be a DNS label (at most 63 characters), stricter than the DNS
// subdomain Kubernetes allows for object names.
//
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$') && (oldSelf.hasValue() || self.metadata.name.matches('^[a-z]'))",message="metadata.name must be a Service name of at most 63 characters (lower-case letters, digits and '-', starting with a letter): it is the value of the label skipper.dev/function on the function's instances and the name of the function's own Service (a Function made before names had to start with a letter keeps its name)",optionalOldSelf=true
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=fn,categories=skipper
// +kubebuilder:printcolumn:name="Pool",type=string,JSONPath=`.spec.pool`
// +kubebuilder:printcolumn:name="Min",type=integer,JSONPath=`.spec.minInstances`
// +kubebuilder:printcolumn:name="Max",type=integer,JSONPath=`.spec.maxInstances`
// +kubebuilder:printcolumn:name="Desired",type=integer,JSONPath=`.status.desired`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.ready`
// +kubebuilder:printcolumn:name="Owner",type=string,JSONPath=`.status.owner`,priority=1
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.lastScaleReason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Function struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   FunctionSpec   `json:"spec"`
	Status FunctionStatus `json:"status,omitempty"`
}

// FunctionSpec is what the user asks for.
//
// +kubebuilder:validation:XValidation:rule="!has(self.minInstances) || self.minInstances <= self.maxInstances",message="minInstances must not exceed maxInstances"
type FunctionSpec struct {
	// Pool names the pool (a Deployment labelled skipper.dev/pool=<pool>) in the
	// Function's namespace whose warm pods become this function's instances.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Pool string `json:"pool"`

	// Port the instance serves HTTP on. 0 or unset: the pool template's first
	// container port.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Port int32 `json:"port,omitempty"`

	// MinInstances kept assigned at all times. 0 lets the function scale to zero
	// after IdleTimeout. At most 1000, and never above MaxInstances.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	// +kubebuilder:default=0
	// +optional
	MinInstances int32 `json:"minInstances,omitempty"`

	// MaxInstances is the most instances the function may hold, 1 to 1000.
	// Every instance is a pod claimed from the pool (an API write), an entry
	// in the ready set pushed to every subscribed router on each change, and
	// a series in the controller's metrics; past 1000 one function's set
	// outgrows what a router's update and a controller's scale-up are sized
	// for, and the load is better split across Functions.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	MaxInstances int32 `json:"maxInstances"`

	// Scaling targets, per instance.
	// +optional
	Scaling Scaling `json:"scaling,omitempty"`

	// ConcurrencyLimit caps the requests one instance serves at a time; 0 means
	// no limit. At most 10000: a limit above what one pod can hold open at
	// once protects nothing, and 0 says "none" plainly.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10000
	// +optional
	ConcurrencyLimit int32 `json:"concurrencyLimit,omitempty"`

	// Oneshot functions get a fresh instance for every request, deleted after it.
	// +optional
	Oneshot bool `json:"oneshot,omitempty"`

	// IdleTimeout after which a function with MinInstances 0 scales to zero:
	// a Go duration ("90s", "5m", "1h30m") from 1s to 24h. Below a second it
	// is shorter than the controller's scale and report intervals and would
	// scale to zero between two requests of a steady caller; a function that
	// must stay up longer than a day should set MinInstances instead.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]*)?(ns|us|µs|ms|s|m|h))+$') && duration(self) >= duration('1s') && duration(self) <= duration('24h')",message="idleTimeout must be a duration such as 90s or 5m, from 1s to 24h"
	// +kubebuilder:default="60s"
	// +optional
	IdleTimeout *metav1.Duration `json:"idleTimeout,omitempty"`

	// Timeout bounds the wait for one response's headers; unset means the
	// router's default. A Go duration from 1ms to 1h: a request held longer
	// than an hour ties up a router connection and an instance slot across
	// rollouts, and belongs on a queue rather than a call.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]*)?(ns|us|µs|ms|s|m|h))+$') && duration(self) >= duration('1ms') && duration(self) <= duration('1h')",message="timeout must be a duration such as 500ms or 30s, from 1ms to 1h"
	// +optional
	Timeout *metav1.Duration `json:"timeout,omitempty"`

	// MaxBodyBytes bounds a request body, in bytes, in place of the
	// router's --max-body-bytes (10 MiB by default): larger or smaller. A
	// larger body is refused 413 body_too_large, at once when its
	// Content-Length says so, as it streams otherwise (the router holds
	// none of it: a limit is not a memory bound). 0 or unset: the router's.
	// At most 1 TiB.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1099511627776
	// +optional
	MaxBodyBytes int64 `json:"maxBodyBytes,omitempty"`

	// Config is handed to the instance when it is assigned: at most 64
	// entries, keys of 1 to 253 characters, values of at most 4096 bytes.
	// It travels in every assign request and in the Function object itself,
	// so it is for settings, not data (at most about 270 KiB in all, well
	// inside etcd's 1.5 MiB object limit).
	// +kubebuilder:validation:MaxProperties=64
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.size() >= 1 && k.size() <= 253 && self[k].size() <= 4096)",message="config keys must be 1 to 253 characters and values at most 4096 characters"
	// +optional
	Config map[string]string `json:"config,omitempty"`

	// Callers limits who may call the function. Unset, or both lists
	// empty: any caller in the cluster (any pod, and anything else that
	// reaches a router). With either list set, a call is served only when
	// the router identifies the calling pod (from the connection's source
	// address, or a sidecar router's own pod) and its namespace or
	// ServiceAccount is listed; other calls get 403 caller_unknown or
	// caller_denied.
	// +optional
	Callers Callers `json:"callers,omitempty"`
}

// Callers are the namespaces and ServiceAccounts allowed to call a
// function. A caller is allowed when either list names it.
type Callers struct {
	// Namespaces whose pods may call the function: DNS labels, at most 64.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +listType=set
	// +optional
	Namespaces []string `json:"namespaces,omitempty"`

	// ServiceAccounts whose pods may call the function, as
	// "<namespace>/<name>": at most 64.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=317
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-.a-z0-9]*[a-z0-9])?$`
	// +listType=set
	// +optional
	ServiceAccounts []string `json:"serviceAccounts,omitempty"`
}

// Empty reports callers that allow any caller.
func (c *Callers) Empty() bool { return len(c.Namespaces) == 0 && len(c.ServiceAccounts) == 0 }

// Scaling holds the per-instance averages the autoscaler aims for. A zero
// CPU or memory target leaves that metric out of the decision.
type Scaling struct {
	// TargetInFlight is the in-flight plus queued requests per instance, 1 to
	// 10000 (the same ceiling as ConcurrencyLimit, which also caps it).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +kubebuilder:default=10
	// +optional
	TargetInFlight int32 `json:"targetInFlight,omitempty"`

	// TargetCPUMilli is the average CPU per instance, in millicores; at most
	// 1000000 (1000 cores), more than any node offers one pod: no reachable
	// target is refused, and a typo of a few orders of magnitude is.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000000
	// +optional
	TargetCPUMilli int32 `json:"targetCPUMilli,omitempty"`

	// TargetMemoryMiB is the average memory per instance, in MiB; at most
	// 1048576 (1 TiB), more than any node offers one pod, for the same
	// reason as TargetCPUMilli.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1048576
	// +optional
	TargetMemoryMiB int32 `json:"targetMemoryMiB,omitempty"`
}

// FunctionStatus is what the owning controller observed and decided.
type FunctionStatus struct {
	// ObservedGeneration is the spec generation the status reflects.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Desired is the instance count the controller converges to.
	// +optional
	Desired int32 `json:"desired"`
	// Ready is the number of assigned instances that are ready.
	// +optional
	Ready int32 `json:"ready"`
	// Owner is the pod name of the controller replica that owns the function.
	// +optional
	Owner string `json:"owner,omitempty"`
	// LastScaleTime is when Desired last changed.
	// +optional
	LastScaleTime *metav1.Time `json:"lastScaleTime,omitempty"`
	// LastScaleReason says which metric or rule set Desired.
	// +optional
	LastScaleReason string `json:"lastScaleReason,omitempty"`
	// Conditions: Ready, PoolAvailable, and Degraded (True, reason
	// InvalidSpec, while the stored object is one the controller cannot act
	// on; it goes back to False once the object is fixed).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// FunctionList is a list of Functions.
//
// +kubebuilder:object:root=true
type FunctionList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Function `json:"items"`
}

// Key is the function's "namespace/name", the form used in headers, labels of
// metrics and on the ring.
func (f *Function) Key() string { return f.Namespace + "/" + f.Name }

// TargetInFlight returns the in-flight target with its default applied.
func (s *FunctionSpec) TargetInFlight() int32 {
	if s.Scaling.TargetInFlight <= 0 {
		return DefaultTargetInFlight
	}
	return s.Scaling.TargetInFlight
}

// IdleTimeoutOrDefault returns the idle timeout with its default applied.
func (s *FunctionSpec) IdleTimeoutOrDefault() time.Duration {
	if s.IdleTimeout == nil {
		return DefaultIdleTimeout
	}
	return s.IdleTimeout.Duration
}

// TimeoutOrZero returns the per-request timeout, 0 when unset.
func (s *FunctionSpec) TimeoutOrZero() time.Duration {
	if s.Timeout == nil {
		return 0
	}
	return s.Timeout.Duration
}
