package attach

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"skipper.dev/skipper/tests/cluster"
)

// RepoRoot returns the directory of the skipper.dev/skipper go.mod above the
// working directory.
func RepoRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; d != "/"; d = filepath.Dir(d) {
		if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && strings.HasPrefix(string(b), "module skipper.dev/skipper\n") {
			return d, nil
		}
	}
	return "", fmt.Errorf("no skipper.dev/skipper go.mod above %s", wd)
}

// OrStart uses the running cluster when .skipper/env answers, or starts one
// (waiting at most upTimeout for `skipper: ready`) and returns the function
// that stops it.
func OrStart(root string, upTimeout time.Duration) (func(), error) {
	if e, err := cluster.ReadEnv(filepath.Join(root, ".skipper", "env")); err == nil && RouterAnswers(e["ROUTER_URL"]) {
		// The registry reads bin/image once, at the cluster's start, and
		// the kubelets pull a :dev tag they have only once: a make image
		// since then would go untested.
		if now, err := cluster.LayoutDigest(filepath.Join(root, "bin")); err == nil && now != e["SKIPPER_CLUSTER_LAYOUT_DIGEST"] {
			return nil, fmt.Errorf("the running cluster serves other images than bin/image (make image ran since it started): restart it (make down, then make up or make e2e)")
		}
		return func() {}, nil
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("no local cluster runs and starting one needs root (sudo make e2e)")
	}
	bin := filepath.Join(root, "bin", "skipper-cluster")
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("%s missing: run make build kube containerd crictl image first (make e2e does): %w", bin, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "up")
	// stop (below) cancels ctx: SIGTERM asks the cluster to go down, and
	// it is killed if it is not down within two minutes.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 2 * time.Minute
	cmd.Dir = root
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	out, err := cmd.StdoutPipe()
	if err != nil {
		cancel()
		return nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		cancel()
		return nil, fmt.Errorf("start %s up: %w", bin, err)
	}
	stop := func() {
		cancel()
		_ = cmd.Wait()
	}
	ready := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(os.Stderr, "cluster:", line)
			if strings.HasPrefix(line, "skipper: ready") {
				ready <- nil
				_, _ = io.Copy(os.Stderr, out)
				return
			}
		}
		ready <- errors.New("skipper-cluster up exited before it was ready")
	}()
	select {
	case err := <-ready:
		if err != nil {
			stop()
			return nil, err
		}
		return stop, nil
	case <-time.After(upTimeout):
		stop()
		return nil, fmt.Errorf("cluster not ready within %s", upTimeout)
	}
}

// RouterAnswers reports whether an HTTP server answers at url.
func RouterAnswers(url string) bool {
	if url == "" {
		return false
	}
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url + "/")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return true
}
