package image

import (
	"fmt"
	"os"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// The index.json annotations that name an image of a layout: the full
// reference (containerd's, which `ctr images import` reads) and the tag
// alone (the OCI image spec's).
const (
	AnnotationImageName = "io.containerd.image.name"
	AnnotationRefName   = "org.opencontainers.image.ref.name"
)

// Tagged is an image and the reference it is published under.
type Tagged struct {
	Ref   name.Tag
	Image v1.Image
}

// Summary is what a caller prints about an image it wrote or pushed.
type Summary struct {
	Ref    string  // the full reference
	Digest v1.Hash // the manifest's
	Size   int64   // manifest, config and compressed layers, in bytes
}

// ParseTag parses a full reference with an explicit registry, repository
// and tag ("ghcr.io/skipper-dev/skipper:dev"): what a layout records and a
// registry is pushed under.
func ParseTag(ref string) (name.Tag, error) {
	t, err := name.NewTag(ref, name.StrictValidation)
	if err != nil {
		return name.Tag{}, fmt.Errorf("image reference %q: %w (want registry/repository:tag)", ref, err)
	}
	return t, nil
}

// WriteLayout writes images as an OCI image layout in dir (created if
// missing): index.json lists exactly these images, in this order, each
// annotated with its reference, and blobs of earlier builds that no image
// uses any more are removed. Blobs already present are not rewritten.
func WriteLayout(dir string, images []Tagged) ([]Summary, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return nil, fmt.Errorf("layout %s: %w", dir, err)
	}
	var out []Summary
	for _, t := range images {
		cf, err := t.Image.ConfigFile()
		if err != nil {
			return nil, fmt.Errorf("%s: config: %w", t.Ref, err)
		}
		err = p.AppendImage(t.Image,
			layout.WithAnnotations(map[string]string{
				AnnotationImageName: t.Ref.Name(),
				AnnotationRefName:   t.Ref.TagStr(),
			}),
			layout.WithPlatform(v1.Platform{OS: cf.OS, Architecture: cf.Architecture}))
		if err != nil {
			return nil, fmt.Errorf("%s: write to layout %s: %w", t.Ref, dir, err)
		}
		s, err := summarize(t.Ref.Name(), t.Image)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	stale, err := p.GarbageCollect()
	if err != nil {
		return nil, fmt.Errorf("layout %s: find stale blobs: %w", dir, err)
	}
	for _, h := range stale {
		if err := p.RemoveBlob(h); err != nil {
			return nil, fmt.Errorf("layout %s: remove stale blob: %w", dir, err)
		}
	}
	return out, nil
}

// ReadLayout returns the images of the layout in dir with the references
// AnnotationImageName gives them.
func ReadLayout(dir string) ([]Tagged, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("layout %s: %w", dir, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("layout %s: %w", dir, err)
	}
	var out []Tagged
	for _, d := range im.Manifests {
		if !d.MediaType.IsImage() {
			return nil, fmt.Errorf("layout %s: %s is a %s, not an image", dir, d.Digest, d.MediaType)
		}
		ref, ok := d.Annotations[AnnotationImageName]
		if !ok {
			return nil, fmt.Errorf("layout %s: image %s has no %s annotation", dir, d.Digest, AnnotationImageName)
		}
		tag, err := ParseTag(ref)
		if err != nil {
			return nil, fmt.Errorf("layout %s: image %s: %w", dir, d.Digest, err)
		}
		img, err := idx.Image(d.Digest)
		if err != nil {
			return nil, fmt.Errorf("layout %s: image %s: %w", dir, d.Digest, err)
		}
		out = append(out, Tagged{Ref: tag, Image: img})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("layout %s: no images", dir)
	}
	return out, nil
}

func summarize(ref string, img v1.Image) (Summary, error) {
	d, err := img.Digest()
	if err != nil {
		return Summary{}, fmt.Errorf("%s: digest: %w", ref, err)
	}
	m, err := img.Manifest()
	if err != nil {
		return Summary{}, fmt.Errorf("%s: manifest: %w", ref, err)
	}
	size, err := img.Size()
	if err != nil {
		return Summary{}, fmt.Errorf("%s: size: %w", ref, err)
	}
	size += m.Config.Size
	for _, l := range m.Layers {
		size += l.Size
	}
	return Summary{Ref: ref, Digest: d, Size: size}, nil
}
