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

func TestParseCgroup2Mount(t *testing.T) {
	tests := []struct {
		name, mounts, want string
		wantErr            bool
	}{
		{"hybrid", "tmpfs /sys/fs/cgroup tmpfs rw 0 0\ncgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\ncgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n", "/sys/fs/cgroup/unified", false},
		{"unified", "cgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n", "/sys/fs/cgroup", false},
		{"escaped", "cgroup2 /mnt/my\\040cg cgroup2 rw 0 0\n", "/mnt/my cg", false},
		{"none", "cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseCgroup2Mount(bytes.NewBufferString(tt.mounts))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v", err)
			}
			if got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}
