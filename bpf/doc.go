// Package bpf will hold the eBPF connect-time steering programs (C sources,
// committed bpf2go outputs) and their loader (issue 6). Until then the router
// runs without BPF and callers reach it through the skipper Service.
package bpf
