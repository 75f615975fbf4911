package cluster

import (
	"bytes"
	"context"
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"

	"skipper.dev/skipper/tests/golden"
)

func TestHelpGolden(t *testing.T) {
	for _, k := range []string{"SKIPPER_REPO", "SKIPPER_STATE_DIR", "SKIPPER_BIN_DIR", "SKIPPER_NODES", "SKIPPER_READY_FUNCTION",
		"SKIPPER_START_TIMEOUT", "SKIPPER_READY_TIMEOUT", "SKIPPER_STOP_TIMEOUT"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	var out bytes.Buffer
	if err := Run(context.Background(), []string{"--help"}, &out); err != nil {
		t.Fatal(err)
	}
	golden.Check(t, "help.golden", out.Bytes())
}

func TestEnvFormat(t *testing.T) {
	got := FormatEnv([]EnvVar{{"KUBECONFIG", "/work/main/.skipper/kubeconfig"}, {"X", "it's"}})
	want := "export KUBECONFIG='/work/main/.skipper/kubeconfig'\nexport X='it'\\''s'\n"
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}
