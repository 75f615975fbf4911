package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"skipper.dev/skipper/controller/assign"
	"skipper.dev/skipper/controller/flagenv"
	"skipper.dev/skipper/controller/instance/instancetest"
	"skipper.dev/skipper/tests/golden"
)

const testUID = "uid-agent"

// startAgent serves the agent with cfg's defaults changed by mutate, on
// loopback, until the test ends, and returns its URL and its key.
func startAgent(t *testing.T, mutate func(*Config)) (string, *instancetest.Key, Config) {
	t.Helper()
	k := instancetest.NewKey(t)
	k.Write(t)
	cfg := DefaultConfig()
	cfg.PodUID, cfg.PodName, cfg.AssignKey, cfg.Dir = testUID, "pool-abc", k.Path, filepath.Join(t.TempDir(), "assignment")
	if mutate != nil {
		mutate(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, cfg, slog.New(slog.DiscardHandler), ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return "http://" + ln.Addr().String(), k, cfg
}

// TestAgentHandsOver: an assign the agent accepts is in its files (and
// the application's hook got it first); GET says what it holds.
func TestAgentHandsOver(t *testing.T) {
	t.Parallel()
	var hooked Handed
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewDecoder(r.Body).Decode(&hooked)
	}))
	t.Cleanup(app.Close)
	url, k, cfg := startAgent(t, func(c *Config) { c.Hook = app.URL + "/skipper/assigned" })
	req := k.Sign(t, testUID, assign.Request{Function: "default/hello", Config: map[string]string{"greeting": "hi"}, Claim: "a"}, time.Now(), time.Minute)
	if status, m := instancetest.Assign(t, http.DefaultClient, url, instancetest.Encode(t, req)); status != http.StatusOK {
		t.Fatalf("assign: %d %v", status, m)
	}
	if hooked.Function != "default/hello" || hooked.Config["greeting"] != "hi" {
		t.Errorf("the hook got %+v", hooked)
	}
	fn, err := os.ReadFile(filepath.Join(cfg.Dir, fileFunction))
	if err != nil || string(fn) != "default/hello\n" {
		t.Errorf("function file %q, %v", fn, err)
	}
	resp, err := http.Get(url + assign.Path + "?pod=" + testUID)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET of what it holds: %d", resp.StatusCode)
	}
	resp, err = http.Get(url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("healthz: %d", resp.StatusCode)
	}
}

// TestAgentHookRefuses: an application whose hook refuses the assignment
// refuses the claim (503 handover_failed), and no file says it holds it.
func TestAgentHookRefuses(t *testing.T) {
	t.Parallel()
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "not ready for functions", http.StatusServiceUnavailable)
	}))
	t.Cleanup(app.Close)
	url, k, cfg := startAgent(t, func(c *Config) { c.Hook = app.URL })
	req := k.Sign(t, testUID, assign.Request{Function: "default/hello", Claim: "a"}, time.Now(), time.Minute)
	status, m := instancetest.Assign(t, http.DefaultClient, url, instancetest.Encode(t, req))
	if status != http.StatusServiceUnavailable || m["reason"] != "handover_failed" || !strings.Contains(m["error"].(string), "not ready for functions") {
		t.Fatalf("assign: %d %v, want 503 handover_failed with the application's answer", status, m)
	}
	for _, f := range []string{fileAssignment, fileConfig, fileFunction} {
		if _, err := os.Stat(filepath.Join(cfg.Dir, f)); !os.IsNotExist(err) {
			t.Errorf("%s after a refusal: %v", f, err)
		}
	}
}

func TestConfigRefusesBadValues(t *testing.T) {
	t.Parallel()
	env := func(string) (string, bool) { return "", false }
	_, err := ParseConfig([]string{"--hook=ftp://x", "--dir=relative", "--hook-timeout=0s"}, env, &strings.Builder{})
	for _, want := range []string{"--pod-uid is required", "--hook", "--dir", "--hook-timeout"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not name %s", err, want)
		}
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if err := Run(t.Context(), []string{"--help"}, flagenv.Map(nil), &out); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("Run(--help) = %v, want flag.ErrHelp", err)
	}
	golden.Check(t, "help.golden", out.Bytes())
}

// TestAgentRefusedRepeatKeepsTheFiles: a repeat assign (new config) the
// application's hook refuses leaves the files of what it holds.
func TestAgentRefusedRepeatKeepsTheFiles(t *testing.T) {
	t.Parallel()
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var h Handed
		if json.NewDecoder(r.Body).Decode(&h) != nil || h.Config["v"] == "2" {
			http.Error(w, "v2 not supported", http.StatusConflict)
		}
	}))
	t.Cleanup(app.Close)
	url, k, cfg := startAgent(t, func(c *Config) { c.Hook = app.URL })
	for _, tc := range []struct {
		v    string
		want int
	}{{"1", http.StatusOK}, {"2", http.StatusServiceUnavailable}} {
		req := k.Sign(t, testUID, assign.Request{Function: "default/hello", Config: map[string]string{"v": tc.v}, Claim: tc.v}, time.Now(), time.Minute)
		if status, m := instancetest.Assign(t, http.DefaultClient, url, instancetest.Encode(t, req)); status != tc.want {
			t.Fatalf("assign v%s: %d %v, want %d", tc.v, status, m, tc.want)
		}
	}
	b, err := os.ReadFile(filepath.Join(cfg.Dir, fileConfig))
	if err != nil || string(b) != `{"v":"1"}` {
		t.Errorf("config.json after a refused repeat: %q %v, want the held v1", b, err)
	}
}
