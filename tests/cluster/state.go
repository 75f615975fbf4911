package cluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// State is the cluster's state directory (.skipper/ in the repository).
type State struct {
	Dir string // absolute
}

// UpPidName names the pid file of the foreground `up` process itself.
const UpPidName = "skipper-cluster"

func (s State) PidPath(name string) string { return filepath.Join(s.Dir, name+".pid") }
func (s State) LogPath(name string) string { return filepath.Join(s.Dir, "logs", name+".log") }
func (s State) PodLogDir() string          { return filepath.Join(s.Dir, "logs", "pods") }
func (s State) PKI() string                { return filepath.Join(s.Dir, "pki") }
func (s State) EtcdDir() string            { return filepath.Join(s.Dir, "etcd") }
func (s State) Kubeconfig() string         { return filepath.Join(s.Dir, "kubeconfig") }
func (s State) EnvPath() string            { return filepath.Join(s.Dir, "env") }

// pidFiles lists the pid files in the state directory by name (without .pid).
func (s State) pidFiles() ([]string, error) {
	entries, err := os.ReadDir(s.Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", s.Dir, err)
	}
	var names []string
	for _, e := range entries {
		if name, ok := strings.CutSuffix(e.Name(), ".pid"); ok && !e.IsDir() {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names, nil
}

// Live returns the names and pids of cluster processes that still run.
func (s State) Live() (map[string]int, error) {
	names, err := s.pidFiles()
	if err != nil {
		return nil, err
	}
	live := map[string]int{}
	for _, name := range names {
		pid, alive, err := readPidFile(s.PidPath(name))
		if err != nil || !alive || pid == os.Getpid() {
			continue
		}
		live[name] = pid
	}
	return live, nil
}

// removeRuntime deletes everything in the state directory except logs/.
func (s State) removeRuntime() error {
	entries, err := os.ReadDir(s.Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list %s: %w", s.Dir, err)
	}
	var errs []error
	for _, e := range entries {
		if e.Name() == "logs" {
			continue
		}
		if err := os.RemoveAll(filepath.Join(s.Dir, e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
