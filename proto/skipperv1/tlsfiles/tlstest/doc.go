// Package tlstest makes certificates and Secret-volume directories for
// tests of TLS on the controllers' gRPC port: an ECDSA P-256 CA, leaves
// it signs for DNS names, and a directory laid out and updated the way
// the kubelet writes a Secret volume (files linked through ..data, which
// an update swaps atomically).
package tlstest
