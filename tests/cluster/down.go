package cluster

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"skipper.dev/skipper/tests/linuxhost"
)

// Down stops a running cluster from any shell and removes everything it
// made. The foreground `up` is asked to stop first (SIGTERM: it tears down
// itself); whatever is left is then swept. Idempotent.
func Down(cfg *Config, log *slog.Logger) error {
	if os.Geteuid() != 0 {
		return errors.New("skipper-cluster down needs root")
	}
	if pid, alive, err := readPidFile(cfg.State.PidPath(UpPidName)); err == nil && alive && pid != os.Getpid() {
		log.Info("stopping skipper-cluster up", "pid", pid)
		_ = syscall.Kill(pid, syscall.SIGTERM)
		// up stops every child (each within StopTimeout) and sweeps.
		wait := 3*cfg.StopTimeout + 30*time.Second
		deadline := time.Now().Add(wait)
		for pidAlive(pid) && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		if pidAlive(pid) {
			log.Warn("skipper-cluster up did not stop in time; killing it", "pid", pid, "waited", wait)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	return cfg.sweep(log)
}

// sweep removes everything a run can have left: processes named by pid
// files, processes in node namespaces and cluster cgroups, namespaces,
// links, routes, cgroups and runtime state. It needs no record of what was
// made, so it also cleans up after a crash.
func (c *Config) sweep(log *slog.Logger) error {
	var errs []error
	names, err := c.State.pidFiles()
	if err != nil {
		errs = append(errs, err)
	}
	// Nodes first (each stops its pods), etcd last.
	slices.SortStableFunc(names, func(a, b string) int { return stopRank(a) - stopRank(b) })
	for _, name := range names {
		if name == UpPidName {
			continue
		}
		pid, alive, err := readPidFile(c.State.PidPath(name))
		if err != nil || !alive || pid == os.Getpid() {
			continue
		}
		log.Info("stopping", "name", name, "pid", pid)
		killPid(pid, c.stopGrace(name))
	}

	nsNames, err := c.Topology.NetnsNames()
	if err != nil {
		errs = append(errs, err)
	}
	for _, name := range nsNames {
		pids, err := linuxhost.NetnsPids(linuxhost.NetnsPath(name))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, pid := range pids {
			if pid == os.Getpid() {
				continue
			}
			log.Info("killing leftover process in netns", "netns", name, "pid", pid)
			killPid(pid, 2*time.Second)
		}
	}

	if cg, err := FindCgroups(c.CgroupName); err == nil {
		if err := cg.Remove(c.StopTimeout); err != nil {
			errs = append(errs, err)
		}
	} else if !errors.Is(err, linuxhost.ErrNoCgroup2) {
		errs = append(errs, err)
	}
	if err := c.Topology.TeardownNetwork(); err != nil {
		errs = append(errs, err)
	}
	if err := c.State.removeRuntime(); err != nil {
		errs = append(errs, fmt.Errorf("remove state: %w", err))
	}
	return errors.Join(errs...)
}

// stopGrace is how long a child named name gets between SIGTERM and
// SIGKILL. A node process stops three things in turn, each within
// StopTimeout (the kubelet, what its pods left, containerd and the shims),
// so it gets four times that and a little more.
func (c *Config) stopGrace(name string) time.Duration {
	if strings.HasPrefix(name, nodeProcPrefix) {
		return 4*c.StopTimeout + 5*time.Second
	}
	return c.StopTimeout
}

func stopRank(name string) int {
	switch {
	case strings.HasPrefix(name, nodeProcPrefix), strings.HasPrefix(name, "kube-proxy"):
		return 0
	case name == "kube-scheduler", name == "kube-controller-manager":
		return 1
	case name == "kube-apiserver":
		return 2
	case name == "etcd":
		return 4
	}
	return 3
}
