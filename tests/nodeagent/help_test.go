package nodeagent

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"skipper.dev/skipper/tests/golden"
)

func TestHelpGolden(t *testing.T) {
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "SKIPPER_NODEAGENT_") {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
	var out bytes.Buffer
	if err := Run(context.Background(), []string{"--help"}, &out); err != nil {
		t.Fatal(err)
	}
	golden.Check(t, "help.golden", out.Bytes())
}

func TestConfigValidate(t *testing.T) {
	var out bytes.Buffer
	_, err := parseFlags(nil, &out)
	if err == nil {
		t.Fatal("no flags: want an error")
	}
	for _, want := range []string{"--kubeconfig", "--node-name", "--node-ip", "--pod-cidr"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
	c, err := parseFlags([]string{"--kubeconfig=/k", "--node-name=node1", "--node-ip=198.51.100.11", "--pod-cidr=198.18.1.0/24",
		"--apiserver-host=198.51.100.1", "--apiserver-port=6443", "--image-dir=ghcr.io/skipper-dev/skipper=/bin"}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxPods != 250 || c.Images["ghcr.io/skipper-dev/skipper"] != "/bin" {
		t.Errorf("config %+v", c)
	}
}
