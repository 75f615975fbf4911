// Package promql checks the PromQL of Skipper's Grafana dashboard and alert
// rules: every expression parses with the Prometheus parser, and every metric
// it reads is one the binaries export. It is a nested module so the
// Prometheus dependency stays out of the main go.mod.
package promql
