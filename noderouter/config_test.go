package noderouter

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"skipper.dev/skipper/controller/flagenv"
	"skipper.dev/skipper/tests/golden"
)

func TestHelpGolden(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if err := Run(t.Context(), []string{"--help"}, flagenv.Map(nil), &out); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("Run(--help) = %v, want flag.ErrHelp", err)
	}
	golden.Check(t, "help.golden", out.Bytes())
}

// fromEnv is what TestParseConfig's environment sets.
func fromEnv(c *Config) {
	c.NodeName, c.PodName = "node-env", "router-env"
	c.ColdStartTimeout = 3 * time.Second
	c.ControllerAddresses = []string{"198.18.1.5:9090", "198.18.1.6:9090"}
}

func TestParseConfig(t *testing.T) {
	t.Parallel()
	env := map[string]string{ // fromEnv; empty means unset
		"NODE_NAME": "node-env", "SKIPPER_POD_NAME": "", "POD_NAME": "router-env", "SKIPPER_LISTEN": "",
		"SKIPPER_COLD_START_TIMEOUT": "3s", "SKIPPER_CONTROLLER_ADDRESSES": "198.18.1.5:9090, 198.18.1.6:9090",
	}
	tests := []struct {
		name    string
		args    []string
		env     map[string]string // over env
		want    func(*Config)
		wantErr []string
	}{
		{
			name: "env fallbacks",
			want: fromEnv,
		},
		{
			name: "flags win",
			args: []string{"--node-name=n2", "--cold-start-timeout", "250ms", "--controller-addresses=127.0.0.1:1", "--listen=198.51.100.11:8380", "--default-namespace=default",
				"--negative-cache-ttl=500ms", "--negative-cache-size=5", "--max-attempts=5", "--retry-backoff-base=1ms", "--retry-backoff-max=1s", "--max-header-bytes=8192", "--max-body-bytes=1048576",
				"--max-in-flight=0", "--cache-idle-timeout=1h"},
			want: func(c *Config) {
				c.NegativeCacheTTL, c.NegativeCacheSize = 500*time.Millisecond, 5
				c.MaxAttempts, c.RetryBackoffBase, c.RetryBackoffMax = 5, time.Millisecond, time.Second
				c.MaxHeaderBytes, c.MaxBodyBytes = 8192, 1<<20
				c.MaxInFlight, c.CacheIdleTimeout = 0, time.Hour
				c.NodeName = "n2"
				c.PodName = "router-env"
				c.ColdStartTimeout = 250 * time.Millisecond
				c.ControllerAddresses = []string{"127.0.0.1:1"}
				c.Listen = "198.51.100.11:8380"
				c.DefaultNamespace = "default"
			},
		},
		{
			name: "every problem at once",
			args: []string{"--node-name=", "--pod-name=", "--mode=sidecar", "--listen=:8380", "--cold-start-timeout=0s", "--controller-addresses=nope", "--default-namespace=Bad", "--reconnect-max=1ms", "--log-level=loud",
				"--negative-cache-ttl=2s", "--negative-cache-size=-1", "--max-attempts=0", "--retry-backoff-base=0s", "--retry-backoff-max=-1s", "--max-header-bytes=10", "--max-body-bytes=-1",
				"--max-in-flight=-1", "--cache-idle-timeout=0s"},
			wantErr: []string{"--node-name is required", "--pod-name is required", "--listen :8380: a sidecar serves its own pod only", "--cold-start-timeout 0s must be positive",
				`"nope"`, "--default-namespace", "--reconnect-max", "--log-level",
				"--negative-cache-ttl 2s", "callable within 2s", "--negative-cache-size -1", "--max-attempts 0", "--retry-backoff-base 0s must be positive",
				"--retry-backoff-max -1s is below", "--max-header-bytes 10", "--max-body-bytes -1",
				"--max-in-flight -1", "--cache-idle-timeout 0s must be positive"},
		},
		{name: "negative cache off", args: []string{"--negative-cache-ttl=0s", "--negative-cache-size=0"}, want: func(c *Config) {
			fromEnv(c)
			c.NegativeCacheTTL, c.NegativeCacheSize = 0, 0
		}},
		{name: "unknown mode", args: []string{"--mode=cluster"}, wantErr: []string{`--mode "cluster"`}},
		{
			name: "controller TLS",
			args: []string{"--controller-tls-dir=/etc/skipper/controller-ca", "--controller-tls-server-name=ctl.example.svc"},
			want: func(c *Config) {
				fromEnv(c)
				c.ControllerTLSDir, c.ControllerTLSServerName = "/etc/skipper/controller-ca", "ctl.example.svc"
			},
		},
		{name: "controller TLS server name", args: []string{"--controller-tls-server-name=Not_A.name"}, wantErr: []string{`--controller-tls-server-name "Not_A.name" is not a DNS name`}},
		{
			name: "sidecar defaults",
			args: []string{"--mode=sidecar"},
			want: func(c *Config) {
				fromEnv(c)
				c.Mode = ModeSidecar
				c.Listen, c.AdminListen = SidecarListen, SidecarAdminListen
				c.LocalAddress, c.BPF, c.CgroupRoot = "", BPFOff, ""
			},
		},
		{
			name: "sidecar with its own loopback port",
			args: []string{"--mode=sidecar", "--listen=[::1]:9000"},
			want: func(c *Config) {
				fromEnv(c)
				c.Mode = ModeSidecar
				c.Listen, c.AdminListen = "[::1]:9000", SidecarAdminListen
				c.LocalAddress, c.BPF, c.CgroupRoot = "", BPFOff, ""
			},
		},
		{
			name:    "sidecar takes no node-level part",
			args:    []string{"--mode=sidecar", "--listen=198.18.1.9:8380", "--local-address=169.254.20.20", "--bpf=auto", "--bpf-vips=198.19.0.10:80"},
			wantErr: []string{"--listen 198.18.1.9:8380: a sidecar serves its own pod only", "--local-address 169.254.20.20: the node-local address belongs to the DaemonSet", "--bpf=auto: BPF steering belongs to the DaemonSet"},
		},
		{
			name: "bpf and local address flags",
			args: []string{"--bpf=auto", "--bpf-vips=198.19.0.10:80, 198.19.0.11:80", "--bpf-cgroup=/sys/fs/cgroup/node2", "--bpf-pin-dir=/sys/fs/bpf/n2",
				"--bpf-max-age=1s", "--local-address=169.254.20.21", "--local-port=8080", "--local-address-interval=1s"},
			want: func(c *Config) {
				fromEnv(c)
				c.BPF, c.BPFVIPs, c.BPFCgroup, c.BPFPinDir, c.BPFMaxAge = BPFAuto, []string{"198.19.0.10:80", "198.19.0.11:80"}, "/sys/fs/cgroup/node2", "/sys/fs/bpf/n2", time.Second
				c.LocalAddress, c.LocalPort, c.LocalAddressInterval = "169.254.20.21", 8080, time.Second
			},
		},
		{
			name: "local address off",
			args: []string{"--local-address="},
			want: func(c *Config) {
				fromEnv(c)
				c.LocalAddress = ""
			},
		},
		{
			name: "every bpf problem at once",
			args: []string{"--bpf=required", "--local-address=", "--bpf-vips=nope,[fd00::1]:80", "--bpf-cgroup=../up", "--bpf-pin-dir=pins", "--bpf-max-age=0s", "--local-port=0", "--local-address-interval=0s"},
			wantErr: []string{"--bpf=required needs --local-address", `--bpf-vips: "nope"`, `--bpf-vips: "[fd00::1]:80"`, `--bpf-cgroup "../up"`,
				`--bpf-pin-dir "pins"`, "--bpf-max-age 0s", "--local-port 0", "--local-address-interval 0s"},
		},
		{name: "bpf on needs VIPs or a Service", args: []string{"--bpf=auto", "--bpf-service="}, wantErr: []string{"--bpf=auto needs --bpf-vips"}},
		{name: "bpf Service needs the API server", args: []string{"--bpf=auto", "--controller-addresses=198.18.1.5:9090"}, wantErr: []string{"--bpf=auto needs --bpf-vips"}},
		{name: "unknown bpf mode", args: []string{"--bpf=maybe"}, wantErr: []string{`--bpf "maybe"`}},
		{name: "IPv6 local address", args: []string{"--local-address=fd00::1"}, wantErr: []string{`--local-address "fd00::1"`}},
		{name: "bad duration", args: []string{"--report-interval=soon"}, wantErr: []string{"report-interval"}},
		{
			name:    "bad env values, each named with its flag",
			env:     map[string]string{"SKIPPER_REPORT_INTERVAL": "soon", "SKIPPER_MAX_QUEUE": "lots", "SKIPPER_CALLER_INDEX": "maybe"},
			wantErr: []string{`"soon" for flag --report-interval from SKIPPER_REPORT_INTERVAL`, `"lots" for flag --max-queue from SKIPPER_MAX_QUEUE`, `"maybe" for flag --caller-index from SKIPPER_CALLER_INDEX`},
		},
		{
			name: "sidecar from the environment",
			env:  map[string]string{"SKIPPER_MODE": "sidecar", "SKIPPER_LISTEN": "127.0.0.1:9000"},
			want: func(c *Config) {
				fromEnv(c)
				c.Mode = ModeSidecar
				c.Listen, c.AdminListen = "127.0.0.1:9000", SidecarAdminListen
				c.LocalAddress, c.BPF, c.CgroupRoot = "", BPFOff, ""
			},
		},
		{name: "stray argument", args: []string{"extra"}, wantErr: []string{"unexpected arguments"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := maps.Clone(env)
			maps.Copy(e, tt.env)
			got, err := ParseConfig(tt.args, flagenv.Map(e), io.Discard)
			if tt.wantErr != nil {
				if err == nil {
					t.Fatal("want an error")
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := DefaultConfig()
			tt.want(&want)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	t.Parallel()
	err := Run(t.Context(), []string{"--node-name="}, flagenv.Map(nil), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--node-name is required") {
		t.Fatalf("err = %v", err)
	}
	if errors.Is(err, flag.ErrHelp) {
		t.Fatal("not a help request")
	}
}

func TestCleanupHelpGolden(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if err := Run(t.Context(), []string{"bpf-cleanup", "--help"}, flagenv.Map(nil), &out); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("Run(--help) = %v, want flag.ErrHelp", err)
	}
	golden.Check(t, "bpf-cleanup-help.golden", out.Bytes())
}

func TestParseCleanupConfig(t *testing.T) {
	t.Parallel()
	env := flagenv.Map(map[string]string{"SKIPPER_LOCAL_ADDRESS": "", "SKIPPER_BPF_PIN_DIR": "/sys/fs/bpf/from-env"})
	tests := []struct {
		name    string
		args    []string
		want    CleanupConfig
		wantErr string
	}{
		{name: "defaults and env", want: CleanupConfig{BPFPinDir: "/sys/fs/bpf/from-env", LocalAddress: "169.254.20.20"}},
		{name: "flags win", args: []string{"--bpf-pin-dir=/sys/fs/bpf/x", "--local-address="}, want: CleanupConfig{BPFPinDir: "/sys/fs/bpf/x"}},
		{name: "bad address", args: []string{"--local-address=nope"}, wantErr: `--local-address "nope"`},
		{name: "stray argument and bad address at once", args: []string{"--local-address=nope", "now"}, wantErr: `unexpected arguments: ["now"]` + "\n" + `--local-address "nope"`},
		{name: "stray argument", args: []string{"now"}, wantErr: "unexpected arguments"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseCleanupConfig(tt.args, env, io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
		})
	}
}
