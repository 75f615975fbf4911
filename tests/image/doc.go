// Package image builds Skipper's container images here, without Docker and
// without pulling anything, with go-containerregistry: the image users run
// (every Skipper binary at /<binary>, the Dockerfile's user and entrypoint),
// the sandbox ("pause") image the kubelet needs and the local cluster's DNS
// image (CoreDNS from the nested module tests/coredns at /coredns) and the
// e2e tests' pod image (skipper-testpod at /testpod), written as an OCI
// image layout that Serve pushes into an in-process registry. All four are
// required: build fails if a binary is missing. It is a nested
// module so go-containerregistry stays out of the main go.mod (it requires
// the main module, replaced by ../.., for controller/flagenv alone); the
// Dockerfile stays for builds elsewhere, and a test keeps the two in
// agreement (binaries, USER, ENTRYPOINT).
//
// Callers drive it in three steps, each usable alone:
//
//   - Assemble turns a Spec (files, user, entrypoint, creation time) into a
//     v1.Image. It reads the files and does no other I/O: one layer holding
//     each file at /<name>, mode 0755, owned by 0:0, with its capabilities
//     as a security.capability attribute if it has any (CoreDNS's
//     NET_BIND_SERVICE), nothing else.
//   - WriteLayout writes tagged images as an OCI image layout (index.json
//     names each image by its full reference in io.containerd.image.name and
//     by its tag in org.opencontainers.image.ref.name).
//   - Serve pushes every image of a layout into a registry it serves on a
//     listener, under the same repository and tag, and serves until its
//     context ends.
//
// Run is the skipper-image command (build and serve) over the three.
//
// # Reproducible
//
// The same files and the same Spec.Created give the same digests: the tar
// entries are sorted by name and carry only name, mode 0755, uid/gid 0,
// size, Created as their mtime and a file's capabilities (no user or group
// names, no access or change times, no other attribute), and the config's
// created time and history are Created too. Created is the Unix epoch
// unless SOURCE_DATE_EPOCH (or --source-date-epoch) says otherwise, as
// reproducible-builds.org defines it. The layer is compressed with Go's compress/gzip: a Go release that
// changed its output would change the compressed digest (the layer's
// uncompressed diff ID would stay).
//
// # Differences from the Dockerfile's image
//
// The Dockerfile's final stage is gcr.io/distroless/static-debian12:nonroot,
// which cannot be pulled here; these images have no base at all. Missing,
// compared with it: /etc/passwd and /etc/group (user 65532 has no name and
// no home, /home/nonroot), the CA certificates in /etc/ssl/certs and
// SSL_CERT_FILE, tzdata in /usr/share/zoneinfo, /tmp, and the distroless
// licence files. The config sets PATH as distroless does and no working
// directory (the runtime starts in /). None of this is used by a Skipper
// binary today (checked by grepping controller/, noderouter/, cmd/, proto/
// and bpf/): no time.LoadLocation or time zone but UTC, no os/user lookup,
// no temporary files, and no TLS that verifies against the system roots.
// The controller and the router reach the API server with in-cluster
// configuration, whose CA is the service account's ca.crt; the gRPC TLS
// between them (proto/skipperv1/tlsfiles) verifies against a ca.crt it is
// given (its x509 use is key and certificate parsing, not the system pool).
// A binary that starts calling out to public HTTPS endpoints would need CA
// certificates added as a layer. The CoreDNS image, with only the plugins
// tests/coredns links, needs none of it either: it reaches the API server
// with in-cluster configuration, and its forward plugin (unused by the
// local cluster's Corefile) speaks plain DNS.
package image
