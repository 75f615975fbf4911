package main

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// TestHopsChain: on loopback, the router role asks the controller role once
// per cold message and never for a warm one, and the instance answers both
// (the controller's ask and the router's send): the cold call is the four
// round trips coldstart's first call makes, the warm one the two of its
// second.
func TestHopsChain(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var atInstance, atController atomic.Int64
	serve := func(h func(kind byte) error) string {
		t.Helper()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { defer close(done); _ = serveHops(ctx, ln, h) }()
		t.Cleanup(func() { cancel(); <-done })
		return ln.Addr().String()
	}
	count := func(n *atomic.Int64, h func(byte) error) func(byte) error {
		return func(k byte) error { n.Add(1); return h(k) }
	}
	inst, err := hopsHandler(ctx, "instance", "", "")
	if err != nil {
		t.Fatal(err)
	}
	instAddr := serve(count(&atInstance, inst))
	ctrl, err := hopsHandler(ctx, "controller", instAddr, "")
	if err != nil {
		t.Fatal(err)
	}
	ctrlAddr := serve(count(&atController, ctrl))
	router, err := hopsHandler(ctx, "router", instAddr, ctrlAddr)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := dialRetry(ctx, serve(router), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const n = 5
	cold, warm, err := timeHops(ctx, conn, n, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(cold) != n || len(warm) != n {
		t.Fatalf("%d cold and %d warm samples, want %d each", len(cold), len(warm), n)
	}
	if got := atController.Load(); got != n {
		t.Errorf("the controller role saw %d messages, want %d (one per cold call)", got, n)
	}
	if got := atInstance.Load(); got != 3*n {
		t.Errorf("the instance role saw %d messages, want %d (two per cold call, one per warm)", got, 3*n)
	}
	if _, err := hopsHandler(ctx, "proxy", "", ""); err == nil {
		t.Error("an unknown role was accepted")
	}
}
