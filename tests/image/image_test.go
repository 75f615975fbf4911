package image

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeBin writes a small file per name into a new directory, its content
// the name (so every file differs), mode 0600 (the image must not copy
// it), and returns the directory.
func fakeBin(t *testing.T, names ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("#!fake "+n+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func allBins() []string {
	return append(slices.Clone(SkipperBinaries), PauseBinary, CoreDNSBinary, TestPodBinary, HTTPBinBinary)
}

// entry is what a test checks of one tar entry.
type entry struct {
	Name       string
	Type       byte
	Mode       int64
	UID, GID   int
	Uname      string
	Gname      string
	ModTime    time.Time
	Content    string
	PAXRecords map[string]string
}

// layerEntries returns img's only layer's entries, failing unless it has
// exactly one layer.
func layerEntries(t *testing.T, img v1.Image) []entry {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 {
		t.Fatalf("%d layers, want 1", len(layers))
	}
	if mt, _ := layers[0].MediaType(); mt != types.OCILayer {
		t.Errorf("layer media type %s, want %s", mt, types.OCILayer)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var out []entry
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, entry{Name: h.Name, Type: h.Typeflag, Mode: h.Mode, UID: h.Uid, GID: h.Gid,
			Uname: h.Uname, Gname: h.Gname, ModTime: h.ModTime.UTC(), Content: string(b), PAXRecords: h.PAXRecords})
	}
}

func TestAssemble(t *testing.T) {
	bin := fakeBin(t, allBins()...)
	epoch := time.Unix(0, 0).UTC()
	for _, tc := range []struct {
		name       string
		spec       Spec
		files      []string // in the layer, sorted; each file's content names its binary
		from       []string
		pax        map[string]string // every file's PAX records
		user       string
		entrypoint []string
	}{
		{
			name:       "skipper",
			spec:       SkipperSpec(bin, epoch),
			files:      []string{"skipper-agent", "skipper-controller", "skipper-echo", "skipper-noderouter"},
			from:       []string{"skipper-agent", "skipper-controller", "skipper-echo", "skipper-noderouter"},
			user:       "65532:65532",
			entrypoint: []string{"/skipper-controller"},
		},
		{
			name:       "pause",
			spec:       PauseSpec(bin, epoch),
			files:      []string{"pause"},
			from:       []string{"skipper-pause"},
			user:       "65535:65535",
			entrypoint: []string{"/pause"},
		},
		{
			name:       "coredns",
			spec:       CoreDNSSpec(bin, epoch),
			files:      []string{"coredns"},
			from:       []string{"coredns"},
			pax:        map[string]string{"SCHILY.xattr.security.capability": setcapNetBindService},
			user:       "65532:65532",
			entrypoint: []string{"/coredns"},
		},
		{
			name:       "testpod",
			spec:       TestPodSpec(bin, epoch),
			files:      []string{"testpod"},
			from:       []string{"skipper-testpod"},
			user:       "65532:65532",
			entrypoint: []string{"/testpod"},
		},
		{
			name:       "httpbin",
			spec:       HTTPBinSpec(bin, epoch),
			files:      []string{"go-httpbin"},
			from:       []string{"go-httpbin"},
			user:       "65532:65532",
			entrypoint: []string{"/go-httpbin"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			img, err := Assemble(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			var want []entry
			for i, f := range tc.files {
				want = append(want, entry{Name: f, Type: tar.TypeReg, Mode: 0o755, ModTime: epoch, Content: "#!fake " + tc.from[i] + "\n", PAXRecords: tc.pax})
			}
			if diff := cmp.Diff(want, layerEntries(t, img)); diff != "" {
				t.Errorf("layer (-want +got):\n%s", diff)
			}

			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			type config struct {
				OS, Arch, User string
				Entrypoint     []string
				Cmd            []string
				Env            []string
				WorkingDir     string
				Created        time.Time
				DiffIDs        int
			}
			wantCfg := config{OS: "linux", Arch: runtime.GOARCH, User: tc.user, Entrypoint: tc.entrypoint,
				Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, Created: epoch, DiffIDs: 1}
			gotCfg := config{OS: cf.OS, Arch: cf.Architecture, User: cf.Config.User, Entrypoint: cf.Config.Entrypoint,
				Cmd: cf.Config.Cmd, Env: cf.Config.Env, WorkingDir: cf.Config.WorkingDir, Created: cf.Created.UTC(), DiffIDs: len(cf.RootFS.DiffIDs)}
			if diff := cmp.Diff(wantCfg, gotCfg); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}

			m, err := img.Manifest()
			if err != nil {
				t.Fatal(err)
			}
			if m.MediaType != types.OCIManifestSchema1 || m.Config.MediaType != types.OCIConfigJSON {
				t.Errorf("media types: manifest %s, config %s; want OCI's", m.MediaType, m.Config.MediaType)
			}
		})
	}
}

// setcapNetBindService is the security.capability attribute `setcap
// cap_net_bind_service=+ep` writes (TestFileCapsAsSetcap checks it against
// setcap itself).
const setcapNetBindService = "\x01\x00\x00\x02\x00\x04\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"

// The attribute the layer carries is the one setcap writes, which is what
// CoreDNS's own image gives /coredns and what the kernel reads at exec.
func TestFileCapsAsSetcap(t *testing.T) {
	setcap, err := exec.LookPath("setcap")
	if err != nil {
		t.Skipf("setcap (Debian's libcap2-bin) not found: %v", err)
	}
	p := filepath.Join(t.TempDir(), "coredns")
	if err := os.WriteFile(p, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(setcap, "cap_net_bind_service=+ep", p).CombinedOutput(); err != nil {
		t.Skipf("setcap needs CAP_SETFCAP and security.* attributes on %s: %v: %s", p, err, out)
	}
	buf := make([]byte, 64)
	n, err := syscall.Getxattr(p, "security.capability", buf)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(setcapNetBindService, string(buf[:n])); diff != "" {
		t.Errorf("setcap's attribute differs from the test's (-test +setcap):\n%s", diff)
	}
	if diff := cmp.Diff(setcapNetBindService, string(fileCaps(CoreDNSCaps))); diff != "" {
		t.Errorf("fileCaps(CoreDNSCaps) (-setcap +fileCaps):\n%s", diff)
	}
}

func digest(t *testing.T, s Spec) v1.Hash {
	t.Helper()
	img, err := Assemble(s)
	if err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// The same binaries give the same digest, whatever their mtimes, modes
// and order; content and the epoch change it.
func TestReproducible(t *testing.T) {
	epoch := time.Unix(0, 0)
	bin := fakeBin(t, SkipperBinaries...)
	base := digest(t, SkipperSpec(bin, epoch))

	// A copy made later, with other mtimes and modes.
	other := fakeBin(t, SkipperBinaries...)
	for i, n := range SkipperBinaries {
		p := filepath.Join(other, n)
		if err := os.Chtimes(p, time.Now(), time.Unix(int64(1e9+i), 0)); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	reordered := SkipperSpec(other, epoch)
	slices.Reverse(reordered.Files)

	changed := fakeBin(t, SkipperBinaries...)
	if err := os.WriteFile(filepath.Join(changed, "skipper-echo"), []byte("another build"), 0o755); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		spec Spec
		same bool
	}{
		{name: "again", spec: SkipperSpec(bin, epoch), same: true},
		{name: "other mtimes, modes and order", spec: reordered, same: true},
		{name: "SOURCE_DATE_EPOCH", spec: SkipperSpec(bin, time.Unix(1700000000, 0)), same: false},
		{name: "one binary changed", spec: SkipperSpec(changed, epoch), same: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := digest(t, tc.spec); (got == base) != tc.same {
				t.Errorf("digest %s, first %s: same = %v, want %v", got, base, got == base, tc.same)
			}
		})
	}
}

func TestAssembleRefuses(t *testing.T) {
	bin := fakeBin(t, "a")
	ok := func() Spec {
		return Spec{Files: []File{{Name: "a", Path: filepath.Join(bin, "a")}}, Entrypoint: []string{"/a"}, OS: "linux", Architecture: "amd64"}
	}
	for _, tc := range []struct {
		name   string
		change func(*Spec)
	}{
		{name: "no files", change: func(s *Spec) { s.Files = nil }},
		{name: "a path as name", change: func(s *Spec) { s.Files[0].Name = "usr/a" }},
		{name: "dot-dot", change: func(s *Spec) { s.Files[0].Name = ".." }},
		{name: "twice", change: func(s *Spec) { s.Files = append(s.Files, s.Files[0]) }},
		{name: "missing file", change: func(s *Spec) { s.Files[0].Path = filepath.Join(bin, "b") }},
		{name: "no entrypoint", change: func(s *Spec) { s.Entrypoint = nil }},
		{name: "no architecture", change: func(s *Spec) { s.Architecture = "" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := ok()
			tc.change(&s)
			if _, err := Assemble(s); err == nil {
				t.Error("Assemble accepted it")
			}
		})
	}
	if _, err := Assemble(ok()); err != nil {
		t.Errorf("the valid spec: %v", err)
	}
}

// A second build into the same layout lists only the new images and
// leaves no blob of the first behind.
func TestWriteLayoutReplaces(t *testing.T) {
	out := t.TempDir()
	ref, err := ParseTag("example.test/skipper-dev/skipper:dev")
	if err != nil {
		t.Fatal(err)
	}
	var last []Summary
	for _, content := range []string{"first", "second"} {
		bin := t.TempDir()
		if err := os.WriteFile(filepath.Join(bin, "a"), []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
		img, err := Assemble(Spec{Files: []File{{Name: "a", Path: filepath.Join(bin, "a")}}, Entrypoint: []string{"/a"}, OS: "linux", Architecture: "amd64"})
		if err != nil {
			t.Fatal(err)
		}
		if last, err = WriteLayout(out, []Tagged{{Ref: ref, Image: img}}); err != nil {
			t.Fatal(err)
		}
	}
	read, err := ReadLayout(out)
	if err != nil {
		t.Fatal(err)
	}
	var got []Summary
	for _, r := range read {
		// Digests, sizes and diff IDs agree with the bytes. (Before the
		// round trip, go-containerregistry's in-memory manifest of a
		// tarball layer has empty annotations where the JSON has none,
		// which validate reports.)
		if err := validate.Image(r.Image); err != nil {
			t.Errorf("validate %s: %v", r.Ref, err)
		}
		s, err := summarize(r.Ref.Name(), r.Image)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, s)
	}
	if diff := cmp.Diff(last, got); diff != "" {
		t.Errorf("layout read back (-written +read):\n%s", diff)
	}
	blobs, err := os.ReadDir(filepath.Join(out, "blobs", "sha256"))
	if err != nil {
		t.Fatal(err)
	}
	if len(blobs) != 3 { // manifest, config, layer
		t.Errorf("%d blobs left, want 3 (manifest, config, layer)", len(blobs))
	}
}
