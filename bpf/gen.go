package bpf

// steer.c is compiled with a pinned clang for little-endian BPF; its outputs
// (steer_bpfel.go, steer_bpfel.o) are committed and `make verify` checks that
// regenerating them changes nothing. -nostdinc: only the headers vendored in
// include/ are used, so the output does not depend on the host's packages.
//
//go:generate go tool bpf2go -cc clang-14 -cflags "-O2 -g -Wall -Werror -nostdinc -Iinclude" -target bpfel -type addr4 -type steer_config -type orig -type sock_key steer steer.c
