package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"skipper.dev/skipper/controller/assign"
)

// Handed is an assignment as the application sees it: the file
// assignment.json, and the body of the hook's POST.
type Handed struct {
	// Function is "namespace/name".
	Function string `json:"function"`
	// Config is the Function's spec.config.
	Config map[string]string `json:"config,omitempty"`
	// Callers are the Function's spec.callers (absent: any caller). The
	// application gets each request's caller in X-Skipper-Caller; nothing
	// makes it check them (docs/security.md).
	Callers *assign.Callers `json:"callers,omitempty"`
	// Oneshot: the instance serves a single request.
	Oneshot bool `json:"oneshot,omitempty"`
	// TimeoutSeconds is the Function's per-request timeout (0: none set).
	TimeoutSeconds float64 `json:"timeoutSeconds,omitempty"`
}

// handedOf is what the application is told of req.
func handedOf(req assign.Request) Handed {
	return Handed{Function: req.Function, Config: req.Config, Callers: req.Callers, Oneshot: req.Oneshot, TimeoutSeconds: req.TimeoutSeconds}
}

// Files written under the assignment directory. assignment.json is
// written last: once it is there, the others are whole.
const (
	fileFunction   = "function"        // "namespace/name" and a newline
	fileConfig     = "config.json"     // spec.config, a JSON object ({} when none)
	fileAssignment = "assignment.json" // Handed
)

// writeFiles writes h into dir, each file whole (written aside, then
// renamed into place), assignment.json last.
func writeFiles(dir string, h Handed) error {
	cfg := h.Config
	if cfg == nil {
		cfg = map[string]string{}
	}
	config, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	all, err := json.Marshal(h)
	if err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		data []byte
	}{{fileFunction, []byte(h.Function + "\n")}, {fileConfig, config}, {fileAssignment, all}} {
		if err := writeWhole(filepath.Join(dir, f.name), f.data); err != nil {
			return err
		}
	}
	return nil
}

// removeFiles removes what writeFiles wrote, assignment.json first: a
// reader that finds it finds the rest.
func removeFiles(dir string) error {
	var errs []error
	for _, name := range []string{fileAssignment, fileConfig, fileFunction} {
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// writeWhole writes data to path through a temporary file in the same
// directory, renamed over path: a reader sees the old file or the new one.
func writeWhole(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	_, werr := tmp.Write(data)
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// hookBodyMax bounds what is read of the application's answer to the
// hook: enough for an error message in the agent's log.
const hookBodyMax = 4 << 10

// callHook POSTs h as JSON to the application's hook url and returns nil
// on a 2xx answer. The application is told before the instance accepts,
// so one that cannot take the function refuses the claim.
func callHook(ctx context.Context, client *http.Client, url string, h Handed, timeout time.Duration) error {
	body, err := json.Marshal(h)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("POST %s: %w", url, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, hookBodyMax))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("POST %s: %s: %s", url, resp.Status, bytes.TrimSpace(msg))
	}
	return nil
}
