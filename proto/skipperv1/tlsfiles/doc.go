// Package tlsfiles serves TLS for the controllers' gRPC port from a
// directory in cert-manager's Secret layout: tls.crt (the certificate
// chain, leaf first), tls.key (its private key) and ca.crt (the CA that
// signs the controllers' certificates). Controllers and routers both use
// it, so it lives beside the gRPC contract (the router imports nothing of
// package controller but its leaf packages).
//
// Load reads the directory once and fails on anything wrong with it, so a
// bad Secret stops the binary at start. After that the files are read
// again at a handshake once Options.Recheck has passed since the last
// read: the kubelet rotates a Secret volume by swapping the directory's
// ..data symlink, so the files are read by name and compared by content
// (never watched by inode). New content that parses replaces the set;
// content that does not is reported once through Options.Reloaded and the
// last good set keeps serving. A read that straddles a swap (a new
// certificate, an old key) is read once more before it counts as bad.
//
// ServerCredentials presents the current certificate at every handshake;
// it does not ask callers for certificates (callers are authenticated by
// their ServiceAccount token). ClientCredentials verifies the server's
// chain against the current ca.crt and the fixed name given, whatever
// address was dialled: controllers are dialled by pod IP, their
// certificate names the controller Service.
package tlsfiles
