// Package deploy holds checks of the shipped build and install artefacts
// that need no cluster: the Dockerfile builds what `make build` builds, the
// same way; the TLS overlay mounts what its flags read; the
// kube-prometheus-stack overlay labels every Prometheus Operator object
// with the chart's release and changes nothing else (rendered with kubectl
// kustomize, skipped without a kubectl).
package deploy
