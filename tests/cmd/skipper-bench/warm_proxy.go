package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/template"
	"time"

	"skipper.dev/skipper/tests/linuxhost"
)

// placement is where a process of the bench runs: a node's network
// namespace (or the root one) and a cgroup in every hierarchy. A process
// that must run in another network namespace is started through nsenter
// (setns holds for one thread only, so a Go program cannot move itself),
// after a shell has written its pid into each cgroup.
type placement struct {
	netns   string   // a name or a path (linuxhost.NetnsPath); "" = the root network namespace
	cgroups []string // cgroup dirs, one per hierarchy; nil = the bench's own
}

// enterScript writes the shell's pid into each cgroup of
// $SKIPPER_BENCH_CGROUPS (':'-separated) and execs its arguments.
const enterScript = `IFS=:; for d in $SKIPPER_BENCH_CGROUPS; do echo $$ >"$d/cgroup.procs" || exit 1; done; unset IFS; exec "$@"`

// command returns name args... placed at p.
func (p placement) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	argv := []string{name}
	if p.netns != "" {
		argv = []string{"nsenter", "--net=" + linuxhost.NetnsPath(p.netns), "--", name}
	}
	argv = append(argv, args...)
	cmd := exec.CommandContext(ctx, "sh", append([]string{"-c", enterScript, "sh"}, argv...)...)
	cmd.Env = append(os.Environ(), "SKIPPER_BENCH_CGROUPS="+strings.Join(p.cgroups, ":"))
	return cmd
}

// makeCgroup creates the cgroup rel in every hierarchy and gives it the CPU
// weight of the cgroup like (relative too): cpu.shares in a v1 cpu
// hierarchy, cpu.weight in cgroup2 where cgroup2 has the cpu controller.
// It returns the dirs, cgroup2 first.
func makeCgroup(hs []linuxhost.Hierarchy, rel, like string) ([]string, error) {
	dirs := linuxhost.Dirs(hs, rel)
	if err := linuxhost.MakeDirs(dirs); err != nil {
		return nil, err
	}
	if like == "" {
		return dirs, nil
	}
	for i, h := range hs {
		var file string
		switch {
		case h.V2():
			file = "cpu.weight"
		case slices.Contains(h.Controllers, "cpu"):
			file = "cpu.shares"
		default:
			continue
		}
		w, err := os.ReadFile(filepath.Join(h.Mount, like, file))
		if errors.Is(err, os.ErrNotExist) {
			continue // no cpu controller in this hierarchy's cgroup
		}
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(dirs[i], file), w, 0o644); err != nil {
			return nil, fmt.Errorf("cgroup %s: %s: %w", dirs[i], file, err)
		}
	}
	return dirs, nil
}

// proxyConfig is what a reverse proxy under test is told.
type proxyConfig struct {
	Dir      string // its scratch directory: config, pid file, temp files
	Listen   string // host:port in the node's network namespace
	Upstream string // the instance, host:port
	Workers  int    // worker processes (nginx), threads (haproxy) or GOMAXPROCS (fastproxy)
}

// nginxConf keeps connections to the instance alive (an upstream block with
// keepalive, HTTP/1.1, the Connection header cleared) and lets a client
// connection carry any number of requests, as the router does.
var nginxConf = template.Must(template.New("nginx").Parse(`# skipper-bench warm: nginx as a keep-alive reverse proxy
worker_processes {{.Workers}};
daemon off;
master_process on;
pid {{.Dir}}/nginx.pid;
error_log stderr warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path {{.Dir}}/body;
    proxy_temp_path {{.Dir}}/proxy;
    fastcgi_temp_path {{.Dir}}/fastcgi;
    uwsgi_temp_path {{.Dir}}/uwsgi;
    scgi_temp_path {{.Dir}}/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 60s;
    upstream instance {
        server {{.Upstream}};
        keepalive 256;
        keepalive_requests 1000000;
    }
    server {
        listen {{.Listen}} backlog=4096;
        location / {
            proxy_pass http://instance;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
`))

// haproxyConf: haproxy keeps both sides alive by default in HTTP mode;
// http-reuse always lets any client connection reuse an idle server one.
var haproxyConf = template.Must(template.New("haproxy").Parse(`# skipper-bench warm: haproxy as a keep-alive reverse proxy
global
    nbthread {{.Workers}}
    maxconn 4096
defaults
    mode http
    option http-keep-alive
    http-reuse always
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    timeout http-keep-alive 60s
frontend bench
    bind {{.Listen}}
    default_backend instance
backend instance
    server instance {{.Upstream}}
`))

// proxyKind is one reverse proxy the router is compared with.
type proxyKind struct {
	name string             // the contender's name, and its binary's unless bin is set
	bin  string             // its binary's name; "" = name
	conf *template.Template // its config file; nil = none, the flags say it all
	args func(c proxyConfig) []string
}

var (
	nginxKind = proxyKind{name: "nginx", conf: nginxConf, args: func(c proxyConfig) []string {
		return []string{"-p", c.Dir, "-c", filepath.Join(c.Dir, "nginx.conf"), "-e", "stderr"}
	}}
	haproxyKind = proxyKind{name: "haproxy", conf: haproxyConf, args: func(c proxyConfig) []string {
		return []string{"-db", "-f", filepath.Join(c.Dir, "haproxy.conf")}
	}}
	// fasthttpKind is tests/fastproxy: a fasthttp.Server and HostClient,
	// keep-alive, bodies streamed, no routing; its GOMAXPROCS the workers.
	fasthttpKind = proxyKind{name: "fasthttp", bin: "fastproxy", args: func(c proxyConfig) []string {
		return []string{"-listen", c.Listen, "-upstream", c.Upstream, "-procs", strconv.Itoa(c.Workers)}
	}}
	// loopKind is tests/loopproxy: an epoll loop per locked thread, its
	// GOMAXPROCS the workers (its loops one fewer, at least one: see its
	// wait).
	loopKind = proxyKind{name: "loop", bin: "loopproxy", args: func(c proxyConfig) []string {
		return []string{"-listen", c.Listen, "-upstream", c.Upstream, "-procs", strconv.Itoa(c.Workers)}
	}}
)

// binName is the name of k's binary.
func (k proxyKind) binName() string {
	if k.bin != "" {
		return k.bin
	}
	return k.name
}

// confFile is the config's file name in the proxy's directory.
func (k proxyKind) confFile() string { return k.name + ".conf" }

// renderProxyConf is k's config for c; "" for a kind without one.
func renderProxyConf(k proxyKind, c proxyConfig) (string, error) {
	if k.conf == nil {
		return "", nil
	}
	var b strings.Builder
	if err := k.conf.Execute(&b, c); err != nil {
		return "", err
	}
	return b.String(), nil
}

// proxyProc is a running reverse proxy.
type proxyProc struct {
	kind proxyKind
	cmd  *exec.Cmd
	done chan error
}

// startProxy writes k's config (if it has one) into c.Dir and starts bin
// (k's binary) at p. Its output goes to stderr.
func startProxy(k proxyKind, bin string, c proxyConfig, p placement, stderr io.Writer) (*proxyProc, error) {
	if k.conf != nil {
		conf, err := renderProxyConf(k, c)
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(c.Dir, k.confFile()), []byte(conf), 0o644); err != nil {
			return nil, err
		}
	}
	// Not tied to a context: stop ends it with SIGTERM (a killed master
	// would leave nginx's workers behind; the cgroup removal catches those).
	cmd := p.command(context.Background(), bin, k.args(c)...)
	cmd.Stdout, cmd.Stderr = stderr, stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", k.name, err)
	}
	pp := &proxyProc{kind: k, cmd: cmd, done: make(chan error, 1)}
	go func() { pp.done <- cmd.Wait() }()
	return pp, nil
}

// waitReady polls url until it answers 200, the proxy exits, or timeout.
func (pp *proxyProc) waitReady(ctx context.Context, url string, timeout time.Duration) error {
	c := &http.Client{Timeout: time.Second, Transport: &http.Transport{Proxy: nil}}
	defer c.CloseIdleConnections()
	deadline := time.Now().Add(timeout)
	for {
		err := get(ctx, c, url, "")
		if err == nil {
			return nil
		}
		select {
		case werr := <-pp.done:
			pp.done <- werr
			return fmt.Errorf("%s exited: %v", pp.kind.name, werr)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s at %s not answering 200 within %s: %w", pp.kind.name, url, timeout, err)
		}
	}
}

// stop asks the proxy to stop (SIGTERM: nginx's fast shutdown, haproxy's
// hard stop, fastproxy's graceful one) and waits up to timeout, then kills it.
func (pp *proxyProc) stop(timeout time.Duration) {
	_ = pp.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-pp.done:
	case <-time.After(timeout):
		_ = pp.cmd.Process.Kill()
		<-pp.done
	}
}

// syncWriter serialises writes from a child's stdout and stderr copiers.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// warmProxies are the reverse proxies run beside the router, by contender
// name, each with the port it listens on at node 1's IP.
var warmProxies = map[string]struct {
	kind proxyKind
	port int
}{
	"nginx":    {nginxKind, 18081},
	"haproxy":  {haproxyKind, 18082},
	"fasthttp": {fasthttpKind, 18083},
	"loop":     {loopKind, 18084},
}
