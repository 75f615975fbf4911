package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// File is one file of an image's layer: the file at Path on this machine
// becomes /<Name> in the image.
type File struct {
	Name string // a plain file name: no slash, not "." or ".."
	Path string
	// Caps are the file's capabilities, permitted and effective (what
	// `setcap <caps>=+ep` gives), one bit per capability number:
	// 1<<CapNetBindService. Zero: none, and no security.capability
	// attribute in the layer.
	Caps uint64
}

// CapNetBindService is the capability to bind ports below 1024
// (linux/capability.h): a non-root process of a file that has it can
// listen on port 53, if the container's bounding set keeps it.
const CapNetBindService = 10

// xattrCapability is the tar PAX record of a file's security.capability
// attribute, as GNU tar and containerd's unpacker spell it.
const xattrCapability = "SCHILY.xattr.security.capability"

// Spec is everything an image is made of.
type Spec struct {
	// Files are the layer's files, in any order (the layer sorts them).
	Files []File
	// User is the config's user, "uid:gid".
	User string
	// Entrypoint is the config's entrypoint.
	Entrypoint []string
	// Env is the config's environment, "KEY=value" entries.
	Env []string
	// OS and Architecture are the config's platform (GOOS and GOARCH
	// spelling: "linux", "amd64").
	OS, Architecture string
	// Created is every file's mtime, the config's created time and its
	// history entry's: the Unix epoch, or SOURCE_DATE_EPOCH.
	Created time.Time
	// CreatedBy is the config's history entry for the layer.
	CreatedBy string
}

// FileMode is the mode of every file in a layer.
const FileMode = 0o755

// Assemble builds s's image: an OCI manifest and config and one gzip
// layer with each file at /<name>, mode FileMode, owned by 0:0, and
// nothing else (no base image). It reads the files now and keeps the
// layer in memory, so later changes to them do not change the image.
func Assemble(s Spec) (v1.Image, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	tb, err := layerTar(s.Files, s.Created)
	if err != nil {
		return nil, err
	}
	layer, err := gzipLayer(tb)
	if err != nil {
		return nil, err
	}
	created := v1.Time{Time: s.Created.UTC()}
	cfg := &v1.ConfigFile{
		Architecture: s.Architecture,
		OS:           s.OS,
		Created:      created,
		Config: v1.Config{
			User:       s.User,
			Entrypoint: slices.Clone(s.Entrypoint),
			Env:        slices.Clone(s.Env),
		},
		RootFS: v1.RootFS{Type: "layers"},
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: created, CreatedBy: s.CreatedBy},
	})
	if err != nil {
		return nil, fmt.Errorf("append layer: %w", err)
	}
	return img, nil
}

func (s Spec) validate() error {
	var errs []error
	if len(s.Files) == 0 {
		errs = append(errs, errors.New("no files"))
	}
	seen := map[string]bool{}
	for _, f := range s.Files {
		if f.Name == "" || f.Name == "." || f.Name == ".." || strings.ContainsAny(f.Name, "/\x00") {
			errs = append(errs, fmt.Errorf("file name %q: want a plain file name", f.Name))
		}
		if seen[f.Name] {
			errs = append(errs, fmt.Errorf("file name %q given twice", f.Name))
		}
		seen[f.Name] = true
	}
	if s.OS == "" || s.Architecture == "" {
		errs = append(errs, fmt.Errorf("platform %q/%q: want both OS and architecture", s.OS, s.Architecture))
	}
	if len(s.Entrypoint) == 0 {
		errs = append(errs, errors.New("no entrypoint"))
	}
	return errors.Join(errs...)
}

// layerTar returns the layer's uncompressed tar: the files sorted by name,
// each header carrying only what the image promises (name, mode, 0:0,
// size, mtime) so the bytes depend on nothing else.
func layerTar(files []File, mtime time.Time) ([]byte, error) {
	files = slices.Clone(files)
	slices.SortFunc(files, func(a, b File) int { return strings.Compare(a.Name, b.Name) })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		if err := addFile(tw, &buf, f, mtime); err != nil {
			return nil, fmt.Errorf("file %s: %w", f.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("tar: %w", err)
	}
	return buf.Bytes(), nil
}

// addFile copies f into tw, growing buf (tw's output) once for it.
func addFile(tw *tar.Writer, buf *bytes.Buffer, f File, mtime time.Time) error {
	r, err := os.Open(f.Path)
	if err != nil {
		return err
	}
	defer r.Close()
	st, err := r.Stat()
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", f.Path)
	}
	buf.Grow(int(st.Size()) + 2*512)
	h := &tar.Header{
		Typeflag: tar.TypeReg,
		Name:     f.Name,
		Mode:     FileMode,
		Size:     st.Size(),
		ModTime:  mtime.Truncate(time.Second),
	}
	if f.Caps != 0 {
		h.PAXRecords = map[string]string{xattrCapability: string(fileCaps(f.Caps))}
	}
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	// A file that grows meanwhile fails here (tar.ErrWriteTooLong), one
	// that shrinks at the next header or Close (bytes missed).
	_, err = io.Copy(tw, r)
	return err
}

// fileCaps encodes caps as a security.capability value: struct
// vfs_cap_data of linux/capability.h, revision 2 (no root ID: the revision
// setcap writes outside a user namespace), little-endian, the effective
// flag set, caps permitted and none inheritable.
func fileCaps(caps uint64) []byte {
	const (
		vfsCapRevision2      = 0x02000000
		vfsCapFlagsEffective = 0x000001
	)
	b := make([]byte, 20)
	binary.LittleEndian.PutUint32(b[0:], vfsCapRevision2|vfsCapFlagsEffective)
	binary.LittleEndian.PutUint32(b[4:], uint32(caps))      // permitted, 0-31
	binary.LittleEndian.PutUint32(b[12:], uint32(caps>>32)) // permitted, 32-63
	return b
}

// gzipLayer compresses the tar once, in memory, and serves the layer from
// those bytes (go-containerregistry would otherwise compress it again for
// every read: digest, layout write, push). The gzip header's name and
// mtime stay empty and zero.
func gzipLayer(tb []byte) (v1.Layer, error) {
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	if _, err := zw.Write(tb); err != nil {
		return nil, fmt.Errorf("gzip: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("gzip: %w", err)
	}
	b := gz.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	return l, nil
}
