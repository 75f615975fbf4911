package controller

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"skipper.dev/skipper/controller/api/v1alpha1"
	skipperv1 "skipper.dev/skipper/proto/skipperv1"
)

// Reasons of a refused caller, in the PermissionDenied status's ErrorInfo
// (domain skipper.dev) and in the router's 403 body.
const (
	ReasonCallerUnknown = "caller_unknown"
	ReasonCallerDenied  = "caller_denied"
	errorDomain         = "skipper.dev"
)

// callerPolicy is a Function's spec.callers as routers are sent it: each
// list sorted, deduplicated and joined by ",", which no namespace or
// ServiceAccount name holds, so that a functionConfig stays comparable.
type callerPolicy struct {
	namespaces, serviceAccounts string
}

func callerPolicyOf(c *v1alpha1.Callers) callerPolicy {
	join := func(v []string) string {
		s := slices.Clone(v)
		slices.Sort(s)
		return strings.Join(slices.Compact(s), ",")
	}
	return callerPolicy{namespaces: join(c.Namespaces), serviceAccounts: join(c.ServiceAccounts)}
}

func (p callerPolicy) empty() bool { return p.namespaces == "" && p.serviceAccounts == "" }

func split(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

func (p callerPolicy) proto() *skipperv1.Callers {
	if p.empty() {
		return nil
	}
	return &skipperv1.Callers{Namespaces: split(p.namespaces), ServiceAccounts: split(p.serviceAccounts)}
}

// checkCaller decides whether the function's callers allow the caller a
// router named in GetInstance: nil when they do (or allow anyone), a
// PermissionDenied error with reason caller_unknown or caller_denied
// otherwise. A caller unset (a router older than callers) is unknown.
func checkCaller(fn *v1alpha1.Function, caller *skipperv1.Caller) error {
	c := &fn.Spec.Callers
	if c.Empty() {
		return nil
	}
	if caller == nil || caller.GetUnknown() || caller.GetNamespace() == "" {
		return callerError(ReasonCallerUnknown, fmt.Sprintf("function %s allows only the callers it lists, and the router could not tell which pod this call came from", fn.Key()))
	}
	if slices.Contains(c.Namespaces, caller.GetNamespace()) ||
		(caller.GetServiceAccount() != "" && slices.Contains(c.ServiceAccounts, caller.GetNamespace()+"/"+caller.GetServiceAccount())) {
		return nil
	}
	return callerError(ReasonCallerDenied, fmt.Sprintf("function %s does not allow ServiceAccount %s/%s (pod %s)",
		fn.Key(), caller.GetNamespace(), caller.GetServiceAccount(), caller.GetPod()))
}

// callerError is the PermissionDenied status of a refused caller, with
// its reason in an ErrorInfo.
func callerError(reason, msg string) error {
	st := status.New(codes.PermissionDenied, reason+": "+msg)
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: errorDomain}); err == nil {
		st = d
	}
	return st.Err()
}

// isCallerRefusal reports an error of checkCaller.
func isCallerRefusal(err error) bool {
	var se interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &se) || se.GRPCStatus().Code() != codes.PermissionDenied {
		return false
	}
	for _, d := range se.GRPCStatus().Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == errorDomain {
			return true
		}
	}
	return false
}
