package cluster

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite golden files in testdata/")

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
	golden := filepath.Join("testdata", "help.golden")
	if *update {
		if err := os.WriteFile(golden, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), out.String()); diff != "" {
		t.Errorf("--help (-want +got):\n%s", diff)
	}
}

func TestEnvFormat(t *testing.T) {
	got := FormatEnv([]EnvVar{{"KUBECONFIG", "/work/main/.skipper/kubeconfig"}, {"X", "it's"}})
	want := "export KUBECONFIG='/work/main/.skipper/kubeconfig'\nexport X='it'\\''s'\n"
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}
