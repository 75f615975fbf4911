package controller

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"skipper.dev/skipper/controller/api/v1alpha1"
	skipperv1 "skipper.dev/skipper/proto/skipperv1"
)

func TestCheckCaller(t *testing.T) {
	t.Parallel()
	fn := func(c v1alpha1.Callers) *v1alpha1.Function {
		f := &v1alpha1.Function{}
		f.Namespace, f.Name = "default", "hello"
		f.Spec.Callers = c
		return f
	}
	team := v1alpha1.Callers{Namespaces: []string{"team-a"}, ServiceAccounts: []string{"team-b/frontend"}}
	tests := []struct {
		name    string
		callers v1alpha1.Callers
		caller  *skipperv1.Caller
		reason  string // "" allowed
	}{
		{name: "no callers: anyone", caller: nil},
		{name: "no callers: unknown too", caller: &skipperv1.Caller{Unknown: true}},
		{name: "namespace listed", callers: team, caller: &skipperv1.Caller{Namespace: "team-a", ServiceAccount: "default"}},
		{name: "service account listed", callers: team, caller: &skipperv1.Caller{Namespace: "team-b", ServiceAccount: "frontend"}},
		{name: "another account of a listed account's namespace", callers: team, caller: &skipperv1.Caller{Namespace: "team-b", ServiceAccount: "batch"}, reason: ReasonCallerDenied},
		{name: "same account name elsewhere", callers: team, caller: &skipperv1.Caller{Namespace: "team-c", ServiceAccount: "frontend"}, reason: ReasonCallerDenied},
		{name: "unknown", callers: team, caller: &skipperv1.Caller{Unknown: true}, reason: ReasonCallerUnknown},
		{name: "unset: an older router", callers: team, caller: nil, reason: ReasonCallerUnknown},
		{name: "no namespace", callers: team, caller: &skipperv1.Caller{ServiceAccount: "frontend"}, reason: ReasonCallerUnknown},
		{name: "only accounts listed, empty account", callers: v1alpha1.Callers{ServiceAccounts: []string{"team-b/frontend"}},
			caller: &skipperv1.Caller{Namespace: "team-b"}, reason: ReasonCallerDenied},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkCaller(fn(tt.callers), tt.caller)
			if tt.reason == "" {
				if err != nil {
					t.Fatalf("checkCaller = %v, want allowed", err)
				}
				return
			}
			st := status.Convert(err)
			if st.Code() != codes.PermissionDenied || !strings.HasPrefix(st.Message(), tt.reason+": ") || !isCallerRefusal(err) {
				t.Fatalf("checkCaller = %v %q (refusal %v), want PermissionDenied %s", st.Code(), st.Message(), isCallerRefusal(err), tt.reason)
			}
		})
	}
	if isCallerRefusal(status.Error(codes.PermissionDenied, "not holder")) {
		t.Error("a PermissionDenied without the ErrorInfo counts as a caller refusal")
	}
}

func TestCallerPolicyProto(t *testing.T) {
	t.Parallel()
	p := callerPolicyOf(&v1alpha1.Callers{Namespaces: []string{"b", "a", "b"}, ServiceAccounts: []string{"x/y"}})
	if q := callerPolicyOf(&v1alpha1.Callers{Namespaces: []string{"a", "b"}, ServiceAccounts: []string{"x/y"}}); p != q {
		t.Errorf("the same callers in another order compare unequal: %+v %+v", p, q)
	}
	pc := p.proto()
	if strings.Join(pc.GetNamespaces(), " ") != "a b" || strings.Join(pc.GetServiceAccounts(), " ") != "x/y" {
		t.Errorf("proto = %v", pc)
	}
	if (callerPolicy{}).proto() != nil {
		t.Error("no callers should send no Callers")
	}
}

func TestGetInstanceRefusesCallerBeforeClaiming(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	fn := e.fnFor("private", "echo")
	fn.Spec.Callers = v1alpha1.Callers{Namespaces: []string{"team-a"}}
	e.add(poolDeploy("echo"), fn, poolPod("p1", "echo"))
	r := startReplica(t, e, "ctl-0", nil, nil)

	req := func(c *skipperv1.Caller) *skipperv1.GetInstanceRequest {
		return &skipperv1.GetInstanceRequest{Function: &skipperv1.FunctionRef{Namespace: "default", Name: "private"}, Caller: c}
	}
	for _, c := range []struct {
		caller *skipperv1.Caller
		reason string
	}{
		{nil, ReasonCallerUnknown},
		{&skipperv1.Caller{Unknown: true}, ReasonCallerUnknown},
		{&skipperv1.Caller{Namespace: "team-b", ServiceAccount: "default", Pod: "team-b/web"}, ReasonCallerDenied},
	} {
		_, err := r.client.GetInstance(t.Context(), req(c.caller))
		if st := status.Convert(err); st.Code() != codes.PermissionDenied || !strings.HasPrefix(st.Message(), c.reason) {
			t.Errorf("GetInstance as %v = %v %q, want PermissionDenied %s", c.caller, st.Code(), st.Message(), c.reason)
		}
	}
	if n := len(e.assignRequests()); n != 0 {
		t.Fatalf("%d assigns for refused callers, want none", n)
	}
	resp, err := r.client.GetInstance(t.Context(), req(&skipperv1.Caller{Namespace: "team-a", ServiceAccount: "default"}))
	if err != nil {
		t.Fatalf("GetInstance as team-a: %v", err)
	}
	if got := resp.GetConfig().GetCallers().GetNamespaces(); len(got) != 1 || got[0] != "team-a" {
		t.Errorf("config callers = %v, want the namespaces [team-a]", resp.GetConfig().GetCallers())
	}
}
