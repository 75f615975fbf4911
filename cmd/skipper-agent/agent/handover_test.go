package agent

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"skipper.dev/skipper/controller/assign"
)

func TestWriteFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	req := assign.Request{Function: "default/hello", Config: map[string]string{"greeting": "hi"}, Oneshot: true,
		Callers: &assign.Callers{Namespaces: []string{"team-a"}}, TimeoutSeconds: 2, Token: "secret", Claim: "c1"}
	if err := writeFiles(dir, handedOf(req)); err != nil {
		t.Fatal(err)
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if got := read(fileFunction); got != "default/hello\n" {
		t.Errorf("function file %q", got)
	}
	if got := read(fileConfig); got != `{"greeting":"hi"}` {
		t.Errorf("config file %q", got)
	}
	var h Handed
	if err := json.Unmarshal([]byte(read(fileAssignment)), &h); err != nil {
		t.Fatal(err)
	}
	if h.Function != "default/hello" || h.Config["greeting"] != "hi" || !h.Oneshot || h.TimeoutSeconds != 2 || h.Callers == nil || h.Callers.Namespaces[0] != "team-a" {
		t.Errorf("assignment.json %+v", h)
	}
	if strings.Contains(read(fileAssignment), "secret") || strings.Contains(read(fileAssignment), "c1") {
		t.Error("the token or the claim reached the application")
	}
	// A second assignment (new callers) replaces every file; nothing is
	// left aside.
	if err := writeFiles(dir, Handed{Function: "default/hello"}); err != nil {
		t.Fatal(err)
	}
	if got := read(fileConfig); got != "{}" {
		t.Errorf("config file after an assignment without config: %q", got)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 3 {
		t.Errorf("%d files in the directory, want 3 (no temporary left)", len(entries))
	}
}

func TestCallHook(t *testing.T) {
	t.Parallel()
	var got Handed
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := json.NewDecoder(r.Body).Decode(&got); err != nil || r.Method != http.MethodPost {
			http.Error(w, "bad", 400)
			return
		}
		switch got.Function {
		case "default/refused":
			http.Error(w, "cannot take it", http.StatusConflict)
		case "default/slow":
			<-r.Context().Done() // an application that does not answer: the agent gives up
		}
	}))
	t.Cleanup(app.Close)
	client := app.Client()
	if err := callHook(t.Context(), client, app.URL, Handed{Function: "default/hello", Config: map[string]string{"a": "b"}}, time.Second); err != nil || got.Config["a"] != "b" {
		t.Errorf("accepted hook: %v, the application got %+v", err, got)
	}
	if err := callHook(t.Context(), client, app.URL, Handed{Function: "default/refused"}, time.Second); err == nil || !strings.Contains(err.Error(), "cannot take it") {
		t.Errorf("refused hook: %v, want the application's 409 and message", err)
	}
	if err := callHook(t.Context(), client, app.URL, Handed{Function: "default/slow"}, 50*time.Millisecond); err == nil {
		t.Error("a hook past its timeout succeeded")
	}
}
