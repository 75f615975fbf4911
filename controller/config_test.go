package controller

import (
	"bytes"
	"errors"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"

	"skipper.dev/skipper/controller/flagenv"
	"skipper.dev/skipper/tests/golden"
)

func TestHelpGolden(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	// The usage does not depend on the environment, even a bad one.
	_, err := ParseConfig([]string{"--help"}, flagenv.Map(map[string]string{"SKIPPER_GRPC_LISTEN": "198.18.1.5:1", "SKIPPER_CLAIM_TIMEOUT": "soon"}), &out)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("ParseConfig(--help) error = %v, want flag.ErrHelp", err)
	}
	golden.Check(t, "help.golden", out.Bytes())
}

func TestRunHelpReturnsErrHelp(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if err := Run(t.Context(), []string{"--help"}, flagenv.Map(nil), &out); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("Run(--help) = %v, want flag.ErrHelp", err)
	}
	if !strings.Contains(out.String(), "--grpc-listen") {
		t.Errorf("usage does not list --grpc-listen:\n%s", out.String())
	}
}

func TestParseConfig(t *testing.T) {
	t.Parallel()
	base := func(f func(*Config)) Config {
		c := DefaultConfig()
		f(&c)
		return c
	}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want Config
	}{
		{name: "defaults", want: DefaultConfig()},
		{
			name: "downward API env",
			env:  map[string]string{"POD_NAME": "ctl-0", "POD_NAMESPACE": "skipper-system", "POD_IP": "198.18.1.5"},
			want: base(func(c *Config) { c.PodName, c.PodNamespace, c.PodIP = "ctl-0", "skipper-system", "198.18.1.5" }),
		},
		{
			name: "SKIPPER_ env beats downward API env, flag beats both",
			args: []string{"--pod-name", "from-flag"},
			env:  map[string]string{"POD_NAME": "downward", "SKIPPER_POD_NAME": "skipper", "SKIPPER_POD_NAMESPACE": "ns1", "POD_NAMESPACE": "ns2"},
			want: base(func(c *Config) { c.PodName, c.PodNamespace = "from-flag", "ns1" }),
		},
		{
			name: "an empty SKIPPER_ env counts as unset",
			env:  map[string]string{"SKIPPER_POD_NAME": "", "POD_NAME": "downward", "SKIPPER_CLAIM_TIMEOUT": ""},
			want: base(func(c *Config) { c.PodName = "downward" }),
		},
		{
			name: "a flag shadows a bad env value",
			args: []string{"--claim-timeout=3s"},
			env:  map[string]string{"SKIPPER_CLAIM_TIMEOUT": "soon"},
			want: base(func(c *Config) { c.ClaimTimeout = 3 * time.Second }),
		},
		{
			name: "durations and lists",
			args: []string{"--claim-timeout=3s", "--namespaces", " b, a ,,"},
			env:  map[string]string{"SKIPPER_ASSIGN_TIMEOUT": "250ms", "SKIPPER_GRPC_LISTEN": "198.18.1.5:9090"},
			want: base(func(c *Config) {
				c.ClaimTimeout, c.AssignTimeout, c.Namespaces, c.GRPCListen = 3*time.Second, 250*time.Millisecond, []string{"a", "b"}, "198.18.1.5:9090"
			}),
		},
		{
			name: "limits flags and env",
			args: []string{"--claim-rate-per-router=2.5", "--grpc-max-concurrent-streams=64", "--grpc-keepalive-min-time=30s"},
			env:  map[string]string{"SKIPPER_CLAIM_BURST_PER_ROUTER": "7", "SKIPPER_GRPC_MAX_RECV_MSG_SIZE": "1048576"},
			want: base(func(c *Config) {
				c.ClaimRatePerRouter, c.ClaimBurstPerRouter, c.GRPCMaxConcurrentStreams = 2.5, 7, 64
				c.GRPCMaxRecvMsgSize, c.GRPCKeepaliveMinTime = 1<<20, 30*time.Second
			}),
		},
		{
			name: "scaling flags and env",
			args: []string{"--scale-interval=200ms", "--max-parallel-claims=3"},
			env:  map[string]string{"SKIPPER_DRAIN_TIMEOUT": "4s", "SKIPPER_SCALE_DOWN_STABILIZATION": "5s"},
			want: base(func(c *Config) {
				c.ScaleInterval, c.MaxParallelClaims, c.DrainTimeout, c.ScaleDownStabilization = 200*time.Millisecond, 3, 4*time.Second, 5*time.Second
			}),
		},
		{
			name: "TLS flags and env",
			args: []string{"--tls-dir=/etc/skipper/tls"},
			env:  map[string]string{"SKIPPER_TLS_SERVER_NAME": "ctl.example.svc"},
			want: base(func(c *Config) { c.TLSDir, c.TLSServerName = "/etc/skipper/tls", "ctl.example.svc" }),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseConfig(tt.args, flagenv.Map(tt.env), &bytes.Buffer{})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseConfig (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseConfigErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{name: "bad env duration", env: map[string]string{"SKIPPER_CLAIM_TIMEOUT": "soon"}, want: `invalid value "soon" for flag --claim-timeout from SKIPPER_CLAIM_TIMEOUT`},
		{name: "bad env int among good ones", env: map[string]string{"POD_NAME": "ctl-0", "POD_IP": "198.18.1.5", "SKIPPER_KUBE_API_BURST": "lots"}, want: "--kube-api-burst from SKIPPER_KUBE_API_BURST"},
		{name: "unknown flag", args: []string{"--nope"}, want: "nope"},
		{name: "positional", args: []string{"extra"}, want: "unexpected arguments"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseConfig(tt.args, flagenv.Map(tt.env), &bytes.Buffer{})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error = %v, want one mentioning %q", err, tt.want)
			}
		})
	}
}

func validConfig() Config {
	c := DefaultConfig()
	c.PodName, c.PodNamespace, c.PodIP = "ctl-0", "skipper-system", "198.18.1.5"
	// Tests that are not about authentication call without tokens; those
	// that are (authz_test.go) set tokenreview.
	c.Auth, c.TokenFile = authNone, ""
	return c
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*Config)
		want   []string // substrings of the joined error, all required; none means valid
	}{
		{name: "auth modes and service accounts", modify: func(c *Config) {
			c.Auth, c.RouterServiceAccount, c.ControllerServiceAccount = "mtls", "nobody", "a/b/c"
		}, want: []string{`--auth "mtls"`, `--router-service-account "nobody"`, `--controller-service-account "a/b/c"`}},
		{name: "valid", modify: func(*Config) {}},
		{name: "advertise address instead of pod IP", modify: func(c *Config) { c.PodIP, c.AdvertiseAddress = "", "198.18.1.5:9090" }},
		{
			name:   "missing downward API values, all reported at once",
			modify: func(c *Config) { c.PodName, c.PodNamespace, c.PodIP = "", "", "" },
			want:   []string{"--pod-name: required", "--pod-namespace: required", "--advertise-address: required"},
		},
		{
			name: "bad addresses",
			modify: func(c *Config) {
				c.GRPCListen, c.HTTPListen, c.AdvertiseAddress, c.PodIP = "9090", "x", "host:9090", "nope"
			},
			want: []string{"--grpc-listen", "--http-listen", "--advertise-address", "--pod-ip"},
		},
		{name: "advertise without port", modify: func(c *Config) { c.AdvertiseAddress = "198.18.1.5:0" }, want: []string{"needs a port"}},
		{
			name:   "bad names",
			modify: func(c *Config) { c.Namespaces, c.ControllerService = []string{"Bad_NS"}, "" },
			want:   []string{"--namespaces", "--controller-service"},
		},
		{
			name: "non-positive durations and limits",
			modify: func(c *Config) {
				c.AssignTimeout, c.ClaimTimeout, c.ResyncPeriod, c.KubeAPIQPS, c.KubeAPIBurst = 0, -1, -1, 0, 0
			},
			want: []string{"--assign-timeout", "--claim-timeout", "--resync-period", "--kube-api-qps", "--kube-api-burst"},
		},
		{
			name: "scaling intervals and limits",
			modify: func(c *Config) {
				c.ScaleInterval, c.DrainTimeout, c.StatusInterval, c.OneshotLease = 0, -1, 0, 0
				c.ScaleDownStabilization, c.MaxParallelClaims = -1, 0
			},
			want: []string{"--scale-interval", "--drain-timeout", "--status-interval", "--oneshot-lease",
				"--scale-down-stabilization", "--max-parallel-claims"},
		},
		{
			name: "client limits",
			modify: func(c *Config) {
				c.ClaimRatePerRouter, c.ClaimBurstPerRouter, c.GRPCMaxConcurrentStreams = 0, -1, 0
				c.GRPCMaxRecvMsgSize, c.GRPCKeepaliveMinTime = 1024, 0
			},
			want: []string{"--claim-rate-per-router", "--claim-burst-per-router", "--grpc-max-concurrent-streams",
				"--grpc-max-recv-msg-size: must be at least 65536", "--grpc-keepalive-min-time"},
		},
		{
			name:   "heartbeat timeout not above the report interval",
			modify: func(c *Config) { c.HeartbeatTimeout, c.ReportInterval = time.Second, time.Second },
			want:   []string{"--heartbeat-timeout 1s: must exceed --report-interval"},
		},
		{name: "log level", modify: func(c *Config) { c.LogLevel = "loud" }, want: []string{"--log-level"}},
		{name: "TLS server name", modify: func(c *Config) { c.TLSDir, c.TLSServerName = "/tls", "Not_A_Name" }, want: []string{`--tls-server-name "Not_A_Name"`}},
		{name: "TLS", modify: func(c *Config) { c.TLSDir, c.TLSServerName = "/tls", "ctl.example.svc" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validConfig()
			tt.modify(&c)
			err := c.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Validate() = nil, want errors")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate() = %v\nwant it to mention %q", err, w)
				}
			}
		})
	}
}

func TestValidateRef(t *testing.T) {
	tests := []struct {
		ns, name string
		ok       bool
	}{
		{"default", "echo", true},
		{"default", "echo.v2", true},
		{"", "echo", false},
		{"default", "", false},
		{"Default", "echo", false},
		{"default", "Echo", false},
		{"default", strings.Repeat("a", 64), false}, // too long for a label value
		{"default", "a/b", false},
	}
	for _, tt := range tests {
		t.Run(tt.ns+"/"+tt.name, func(t *testing.T) {
			err := validateRef(tt.ns, tt.name)
			if (err == nil) != tt.ok {
				t.Fatalf("validateRef = %v, want ok %v", err, tt.ok)
			}
			if err != nil && grpcStatus(err).Code() != codes.InvalidArgument {
				t.Errorf("code = %v, want InvalidArgument", grpcStatus(err).Code())
			}
		})
	}
}

func TestRunRejectsInvalidConfigBeforeStarting(t *testing.T) {
	t.Parallel()
	err := Run(t.Context(), []string{"--claim-timeout=0s"}, flagenv.Map(map[string]string{"POD_NAME": ""}), &bytes.Buffer{})
	if err == nil {
		t.Fatal("Run succeeded with an invalid config")
	}
	for _, want := range []string{"--pod-name", "--pod-namespace", "--claim-timeout"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
}
