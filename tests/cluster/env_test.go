package cluster

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestEnvRoundTrip(t *testing.T) {
	vars := []EnvVar{
		{Key: "KUBECONFIG", Value: "/work/main/.skipper/kubeconfig"},
		{Key: "ROUTER_URL", Value: "http://198.51.100.11:8380"},
		{Key: "CONTROLLER_METRICS_URLS", Value: "http://198.18.1.2:9091/metrics http://198.18.2.2:9091/metrics"},
		{Key: "ODD", Value: `it's "quoted"`},
		{Key: "EMPTY", Value: ""},
	}
	want := map[string]string{}
	for _, v := range vars {
		want[v.Key] = v.Value
	}
	if diff := cmp.Diff(want, ParseEnv(FormatEnv(vars)+"# comment\n\n")); diff != "" {
		t.Errorf("ParseEnv(FormatEnv()) (-want +got):\n%s", diff)
	}
}
