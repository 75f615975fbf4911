package cluster

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"skipper.dev/skipper/controller/flagenv"
	"skipper.dev/skipper/tests/golden"
)

func TestHelpGolden(t *testing.T) {
	t.Parallel()
	// The usage shows the defaults whatever the environment says.
	env := flagenv.Map(map[string]string{"SKIPPER_NODES": "5", "SKIPPER_READY_FUNCTION": "x/y", "SKIPPER_STOP_TIMEOUT": "soon"})
	var out bytes.Buffer
	if err := Run(t.Context(), []string{"--help"}, env, &out); err != nil {
		t.Fatal(err)
	}
	golden.Check(t, "help.golden", out.Bytes())
}

func TestParseFlags(t *testing.T) {
	t.Parallel()
	// got is what the tests compare of a Config.
	type got struct {
		State, Function, ProxyMode string
		Nodes                      int
		Apply                      []string
		StopTimeout, LockWait      time.Duration
	}
	def := got{State: "/repo/.skipper", Function: "default/echo", ProxyMode: ProxyIPTables, Nodes: 2,
		Apply: []string{"/repo/deploy/overlays/local", "/repo/deploy/overlays/local-examples"}, StopTimeout: 10 * time.Second, LockWait: 5 * time.Minute}
	with := func(f func(*got)) got {
		g := def
		f(&g)
		return g
	}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want got
	}{
		{name: "defaults", want: def},
		{
			name: "environment",
			env:  map[string]string{"SKIPPER_STATE_DIR": "/s", "SKIPPER_NODES": "3", "SKIPPER_READY_FUNCTION": "ns/fn", "SKIPPER_PROXY_MODE": "nftables", "SKIPPER_STOP_TIMEOUT": "1s", "SKIPPER_APPLY": "x"},
			want: with(func(g *got) {
				g.State, g.Nodes, g.Function, g.ProxyMode, g.StopTimeout = "/s", 3, "ns/fn", ProxyNFTables, time.Second
			}),
		},
		{
			name: "flags over the environment",
			args: []string{"--nodes=1", "--function=", "--apply=deploy/a", "--apply=deploy/b"},
			env:  map[string]string{"SKIPPER_NODES": "3", "SKIPPER_READY_FUNCTION": "ns/fn", "SKIPPER_LOCK_WAIT": "0s"},
			want: with(func(g *got) {
				g.Nodes, g.Function, g.Apply, g.LockWait = 1, "", []string{"/repo/deploy/a", "/repo/deploy/b"}, 0
			}),
		},
		{
			name: "empty variables count as unset",
			env:  map[string]string{"SKIPPER_STATE_DIR": "", "SKIPPER_NODES": "", "SKIPPER_READY_FUNCTION": "", "SKIPPER_STOP_TIMEOUT": ""},
			want: def,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := parseFlags("up", append([]string{"--repo=/repo"}, tt.args...), flagenv.Map(tt.env), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			g := got{State: c.State.Dir, Function: c.Function, ProxyMode: c.ProxyMode, Nodes: c.Nodes, Apply: c.Apply, StopTimeout: c.StopTimeout, LockWait: c.LockWait}
			if diff := cmp.Diff(tt.want, g); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
		})
	}
}

func TestEnvFormat(t *testing.T) {
	got := FormatEnv([]EnvVar{{"KUBECONFIG", "/work/main/.skipper/kubeconfig"}, {"X", "it's"}})
	want := "export KUBECONFIG='/work/main/.skipper/kubeconfig'\nexport X='it'\\''s'\n"
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestParseFlagsErrors(t *testing.T) {
	t.Parallel()
	for name, tt := range map[string]struct {
		args []string
		env  map[string]string
		want string
	}{
		"a bad variable, not the default": {env: map[string]string{"SKIPPER_STOP_TIMEOUT": "10"}, want: `"10" for flag --stop-timeout from SKIPPER_STOP_TIMEOUT`},
		"stray argument":                  {args: []string{"now"}, want: "unexpected arguments"},
	} {
		if _, err := parseFlags("up", tt.args, flagenv.Map(tt.env), io.Discard); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err = %v, want %q", name, err, tt.want)
		}
	}
}
