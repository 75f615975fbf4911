package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	// The plugins a cluster's DNS needs, a subset of core/plugin/zplugin.go
	// of v1.15.0 (generated from plugin.cfg). Compare with plugin.cfg when
	// bumping the version.
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

// directives are the plugins above in the order of
// core/dnsserver/zdirectives.go of v1.15.0, which is the order a query
// passes through them whatever the Corefile's order: each plugin sees only
// what those after it answer.
var directives = []string{
	"reload",
	"ready",
	"health",
	"errors",
	"log",
	"loadbalance",
	"cache",
	"kubernetes",
	"loop",
	"forward",
}

func main() {
	// Read lazily, when the Corefile is parsed: a directive of the
	// Corefile not listed here fails the start ("unknown directive").
	dnsserver.Directives = directives
	coremain.Run()
}
