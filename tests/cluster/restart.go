package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Restartable control-plane processes (issue 15). A test stops
// kube-apiserver (or etcd, kube-controller-manager, kube-scheduler) and
// starts it again while the cluster keeps running, through the unix socket
// the up process serves at <state>/control.sock: Control, or
// `skipper-cluster stop NAME` and `skipper-cluster start NAME`. Any other
// child exiting still tears the cluster down.
//
// An outage is bounded by MaxOutage: a component not started again by then
// is started by the cluster itself, so that nodes stay Ready (the
// kube-controller-manager's node-monitor grace period is 40 s or more).

// MaxOutage bounds how long a stopped component stays stopped.
const MaxOutage = 30 * time.Second

// ControlSocketName is the control socket's file in the state directory.
const ControlSocketName = "control.sock"

// restartable are the components Control may stop and start.
var restartable = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}

// readyFunc waits until a started component answers its health check.
type readyFunc func(ctx context.Context, p *Proc) error

// restartSpec is how a restartable component starts and shows it is up.
type restartSpec struct {
	spec  ProcSpec
	ready readyFunc
}

// spawnRestartable spawns a control-plane component Control may stop and
// start again.
func (c *cluster) spawnRestartable(spec ProcSpec, ready readyFunc) (*Proc, error) {
	p, err := c.spawn(spec)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.restart == nil {
		c.restart = map[string]restartSpec{}
	}
	c.restart[spec.Name] = restartSpec{spec: p.spec, ready: ready}
	c.mu.Unlock()
	return p, nil
}

// watch sends p to c.died when it exits (until ctx ends).
func (c *cluster) watch(ctx context.Context, p *Proc) {
	go func() {
		select {
		case <-p.Done():
			select {
			case c.died <- p:
			case <-ctx.Done():
			}
		case <-ctx.Done():
		}
	}()
}

// stoppedOnRequest reports whether p exited because Control stopped it.
func (c *cluster) stoppedOnRequest(p *Proc) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.retiredProcs[p]
}

// currentLocked is the slot, the running (or last) process and the start
// of the restartable component name.
func (c *cluster) currentLocked(name string) (int, *Proc, restartSpec, error) {
	i := slices.IndexFunc(c.procs, func(p *Proc) bool { return p.Name == name })
	rs, ok := c.restart[name]
	if i < 0 || !ok {
		return -1, nil, restartSpec{}, fmt.Errorf("%q is not a restartable component (want one of %s)", name, strings.Join(restartable, ", "))
	}
	return i, c.procs[i], rs, nil
}

// stopComponent stops name and starts it again after MaxOutage unless
// startComponent did first.
func (c *cluster) stopComponent(ctx context.Context, name string) error {
	c.mu.Lock()
	_, p, _, err := c.currentLocked(name)
	if err != nil {
		c.mu.Unlock()
		return err
	}
	if c.retiredProcs[p] {
		c.mu.Unlock()
		return fmt.Errorf("%s is stopped already", name)
	}
	c.retiredProcs[p] = true
	// Armed with the stop, under the lock a start takes it off with.
	c.outages[name] = time.AfterFunc(MaxOutage, func() {
		switch err := c.startComponent(ctx, name); {
		case err == nil:
			c.log.Warn("started again after the longest outage allowed", "name", name, "max", MaxOutage)
		case !errors.Is(err, errNotStopped) && !errors.Is(err, errClosing):
			c.log.Error("start after the longest outage allowed failed", "name", name, "err", err)
		}
	})
	c.mu.Unlock()
	p.stop(c.cfg.StopTimeout)
	c.log.Info("stopped on request", "name", name, "restart_by", MaxOutage)
	return nil
}

// errClosing: a start while the cluster tears down.
var errClosing = errors.New("the cluster is stopping")

// closeControl ends every pending restart: teardown stops what runs.
func (c *cluster) closeControl() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closing = true
	for _, t := range c.outages {
		t.Stop()
	}
}

// errNotStopped: start of a component that runs.
var errNotStopped = errors.New("not stopped")

// startComponent starts a component Control stopped and waits until it is
// ready.
func (c *cluster) startComponent(ctx context.Context, name string) error {
	c.mu.Lock()
	i, old, rs, err := c.currentLocked(name)
	if err != nil {
		c.mu.Unlock()
		return err
	}
	if c.closing {
		c.mu.Unlock()
		return errClosing
	}
	if !c.retiredProcs[old] {
		c.mu.Unlock()
		return fmt.Errorf("%s: %w", name, errNotStopped)
	}
	select {
	case <-old.Done():
	default:
		// A stop in progress (its client gave up waiting): the new copy
		// would not bind.
		c.mu.Unlock()
		return fmt.Errorf("%s is still stopping", name)
	}
	if t := c.outages[name]; t != nil {
		t.Stop()
		delete(c.outages, name)
	}
	p, err := c.cfg.State.startProc(rs.spec)
	if err != nil {
		c.mu.Unlock()
		return fmt.Errorf("start %s: %w", name, err)
	}
	c.procs[i] = p
	c.mu.Unlock()
	c.watch(ctx, p)
	c.log.Info("started again on request", "name", name, "pid", p.Pid)
	return rs.ready(ctx, p)
}

// serveControl serves the control socket until ctx ends.
func (c *cluster) serveControl(ctx context.Context) (func(), error) {
	path := filepath.Join(c.cfg.State.Dir, ControlSocketName)
	_ = os.Remove(path) // a crashed run's
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	mux := http.NewServeMux()
	handle := func(verb string, f func(context.Context, string) error) {
		mux.HandleFunc("POST /"+verb, func(w http.ResponseWriter, r *http.Request) {
			name := r.URL.Query().Get("name")
			if err := f(ctx, name); err != nil {
				code := http.StatusBadRequest
				if errors.Is(err, errNotStopped) {
					code = http.StatusConflict
				}
				http.Error(w, err.Error(), code)
				return
			}
			fmt.Fprintf(w, "%s %s\n", verb, name)
		})
	}
	handle("stop", c.stopComponent)
	handle("start", c.startComponent)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-done
		_ = os.Remove(path)
	}, nil
}

// Control asks the cluster whose state directory is stateDir to "stop" or
// "start" the control-plane component name. A start returns once the
// component is ready again; a stopped component is started by the cluster
// itself after MaxOutage.
func Control(ctx context.Context, stateDir, verb, name string) error {
	if verb != "stop" && verb != "start" {
		return fmt.Errorf("control: verb %q: want stop or start", verb)
	}
	path := filepath.Join(stateDir, ControlSocketName)
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", path)
	}}}
	defer client.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://cluster/"+verb+"?name="+url.QueryEscape(name), nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("control %s %s (is a cluster up with state dir %s?): %w", verb, name, stateDir, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("control %s %s: %s: %s", verb, name, resp.Status, strings.TrimSpace(string(msg)))
	}
	return nil
}
