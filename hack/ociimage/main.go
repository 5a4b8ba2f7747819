// Command ociimage writes the lock-janitor container image as an OCI image
// layout, without a Docker engine: one image index with an image per platform,
// each a single layer holding the static binary at /lock-janitor on an empty
// base (the same image the Dockerfile builds FROM scratch).
//
//	ociimage -out dist/image -version 0.1.0 -source https://github.com/lock-janitor/lock-janitor \
//	    linux/amd64=path/to/amd64/lock-janitor linux/arm64=path/to/arm64/lock-janitor
//
// The output is reproducible: every timestamp is SOURCE_DATE_EPOCH (default 0),
// so the same binaries give the same digests. hack/release.sh runs it.
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

func main() {
	out := flag.String("out", "", "OCI layout directory to write (replaced)")
	version := flag.String("version", "", "image version (label and ref.name)")
	source := flag.String("source", "", "source repository URL (label)")
	revision := flag.String("revision", "", "source revision (label; optional)")
	licenses := flag.String("licenses", "Apache-2.0", "SPDX license expression (label)")
	flag.Parse()
	if *out == "" || *version == "" || *source == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: ociimage -out DIR -version V -source URL [-revision SHA] os/arch=BINARY...")
		os.Exit(2)
	}
	if err := run(*out, *version, *source, *revision, *licenses, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "ociimage:", err)
		os.Exit(1)
	}
}

func epoch() (time.Time, error) {
	s := os.Getenv("SOURCE_DATE_EPOCH")
	if s == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q: %w", s, err)
	}
	return time.Unix(n, 0).UTC(), nil
}

// layer is a gzip tar holding only /lock-janitor (0755, root-owned: the
// non-root user can run it but not change it).
func layer(bin string, mtime time.Time) (v1.Layer, error) {
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdr := &tar.Header{Name: "lock-janitor", Mode: 0o755, Size: int64(len(data)), ModTime: mtime, Typeflag: tar.TypeReg, Format: tar.FormatPAX}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, err
	}
	if _, err := tw.Write(data); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithMediaType(types.OCILayer))
}

func run(out, version, source, revision, licenses string, platforms []string) error {
	created, err := epoch()
	if err != nil {
		return err
	}
	labels := map[string]string{
		"org.opencontainers.image.title":       "lock-janitor",
		"org.opencontainers.image.description": "Frees leader-election locks (operator-lib ConfigMaps and Leases) whose holder pod can no longer run, so a waiting replica takes over.",
		"org.opencontainers.image.source":      source,
		"org.opencontainers.image.url":         source,
		"org.opencontainers.image.version":     version,
		"org.opencontainers.image.licenses":    licenses,
	}
	if revision != "" {
		labels["org.opencontainers.image.revision"] = revision
	}
	var idx v1.ImageIndex = mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range platforms {
		plat, bin, ok := strings.Cut(p, "=")
		osName, arch, ok2 := strings.Cut(plat, "/")
		if !ok || !ok2 || osName == "" || arch == "" || bin == "" {
			return fmt.Errorf("platform argument %q is not os/arch=BINARY", p)
		}
		l, err := layer(bin, created)
		if err != nil {
			return fmt.Errorf("%s: %w", plat, err)
		}
		img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
		img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
		img, err = mutate.Append(img, mutate.Addendum{Layer: l, History: v1.History{
			Created: v1.Time{Time: created}, CreatedBy: "COPY lock-janitor /lock-janitor", Comment: "hack/ociimage",
		}})
		if err != nil {
			return err
		}
		cf, err := img.ConfigFile()
		if err != nil {
			return err
		}
		cf = cf.DeepCopy()
		cf.OS, cf.Architecture = osName, arch
		cf.Created = v1.Time{Time: created}
		cf.Config.User = "65532:65532"
		cf.Config.Entrypoint = []string{"/lock-janitor", "run"}
		cf.Config.Cmd = nil
		cf.Config.WorkingDir = "/"
		cf.Config.ExposedPorts = map[string]struct{}{"8080/tcp": {}}
		cf.Config.Labels = labels
		img, err = mutate.ConfigFile(img, cf)
		if err != nil {
			return err
		}
		img = mutate.Annotations(img, labels).(v1.Image)
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{
			Platform: &v1.Platform{OS: osName, Architecture: arch},
		}})
	}
	idx = mutate.Annotations(idx, labels).(v1.ImageIndex)
	if err := os.RemoveAll(out); err != nil {
		return err
	}
	lp, err := layout.Write(out, empty.Index)
	if err != nil {
		return err
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": version,
	})); err != nil {
		return err
	}
	d, err := idx.Digest()
	if err != nil {
		return err
	}
	fmt.Println(d.String())
	return nil
}
