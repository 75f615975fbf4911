package dataplane

import (
	"fmt"
	"time"

	"skipper.dev/skipper/noderouter/route"
)

// Options are the data plane's part of the router's configuration: the
// router's Config embeds them, each with its flag and SKIPPER_* variable
// (noderouter/flags.go). DefaultOptions holds the defaults; Validate checks
// them.
type Options struct {
	// DefaultNamespace lets `x-skipper-function: <name>` name a function in
	// this namespace; empty requires <namespace>/<name>.
	DefaultNamespace string
	// ClusterDomain is the cluster's DNS domain: a Host of
	// <name>.<namespace>.svc.<ClusterDomain> names that function (the
	// Function's own Service; route.Hosts). Empty: that form names none.
	ClusterDomain string

	// ColdStartTimeout bounds a GetInstance call on a cache miss.
	ColdStartTimeout time.Duration
	// RequestTimeout bounds a proxied request when the function sets no
	// timeout; 0 means none.
	RequestTimeout time.Duration

	// DialTimeout bounds a TCP connect to an instance.
	DialTimeout time.Duration
	// MaxIdleConnsPerHost is the keep-alive pool size per instance.
	MaxIdleConnsPerHost int
	// IdleConnTimeout closes idle instance connections.
	IdleConnTimeout time.Duration

	// MaxAttempts is how many times a request is sent at most (the first
	// included) when sending it failed before any response: a dial failure,
	// or a broken connection for an idempotent request with no body sent.
	MaxAttempts int
	// MaxQueue bounds, per function, the requests waiting while every
	// instance is at the function's concurrencyLimit; each waits at most
	// ColdStartTimeout. A request over it gets 503. 0: no queue.
	MaxQueue int

	// RetryBackoffBase and RetryBackoffMax bound the jittered exponential
	// wait before each retry.
	RetryBackoffBase time.Duration
	RetryBackoffMax  time.Duration

	// MaxHeaderBytes bounds a request's header (http.Server.MaxHeaderBytes);
	// larger ones get 431.
	MaxHeaderBytes int
	// Forwarder serves HTTP/1.1 callers: ForwarderLoop (event loops for the
	// warm exchange in front of the router's own goroutine path),
	// ForwarderH1 (that path alone) or ForwarderNethttp (net/http and
	// httputil.ReverseProxy). h2c callers are always served by net/http.
	Forwarder string
	// Loops is the number of event loops with ForwarderLoop; 0: one fewer
	// than GOMAXPROCS, at least one.
	Loops int
	// MaxBodyBytes bounds a request body; larger ones get 413. 0 means no
	// limit.
	MaxBodyBytes int64
	// MaxInFlight bounds the requests the router handles at once, across
	// all functions; one more gets 503 with Retry-After (reason
	// router_overloaded). 0 means no limit.
	MaxInFlight int
}

// DefaultOptions returns the defaults.
func DefaultOptions() Options {
	return Options{
		ClusterDomain:       "cluster.local",
		ColdStartTimeout:    10 * time.Second,
		RequestTimeout:      5 * time.Minute,
		DialTimeout:         2 * time.Second,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		MaxAttempts:         3,
		MaxQueue:            100,
		RetryBackoffBase:    10 * time.Millisecond,
		RetryBackoffMax:     500 * time.Millisecond,
		MaxHeaderBytes:      64 << 10,
		Forwarder:           ForwarderLoop,
		MaxBodyBytes:        10 << 20,
		MaxInFlight:         10000,
	}
}

// Validate returns every problem with o, each naming its flag.
func (o Options) Validate() []error {
	var errs []error
	if o.DefaultNamespace != "" && !route.IsDNSLabel(o.DefaultNamespace) {
		errs = append(errs, fmt.Errorf("--default-namespace %q is not a DNS label", o.DefaultNamespace))
	}
	if o.ClusterDomain != "" && !route.IsDNSName(o.ClusterDomain) {
		errs = append(errs, fmt.Errorf("--cluster-domain %q is not a lower-case DNS name without a trailing dot", o.ClusterDomain))
	}
	pos := func(d time.Duration, flag string) {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("--%s %s must be positive", flag, d))
		}
	}
	pos(o.ColdStartTimeout, "cold-start-timeout")
	pos(o.DialTimeout, "dial-timeout")
	pos(o.IdleConnTimeout, "idle-conn-timeout")
	if o.RequestTimeout < 0 {
		errs = append(errs, fmt.Errorf("--request-timeout %s must not be negative", o.RequestTimeout))
	}
	if o.MaxQueue < 0 {
		errs = append(errs, fmt.Errorf("--max-queue %d must not be negative (0: no queue)", o.MaxQueue))
	}
	if o.MaxAttempts < 1 {
		errs = append(errs, fmt.Errorf("--max-attempts %d must be at least 1", o.MaxAttempts))
	}
	pos(o.RetryBackoffBase, "retry-backoff-base")
	if o.RetryBackoffMax < o.RetryBackoffBase {
		errs = append(errs, fmt.Errorf("--retry-backoff-max %s is below --retry-backoff-base %s", o.RetryBackoffMax, o.RetryBackoffBase))
	}
	if o.Forwarder != ForwarderLoop && o.Forwarder != ForwarderH1 && o.Forwarder != ForwarderNethttp {
		errs = append(errs, fmt.Errorf("--forwarder %q must be %s, %s or %s", o.Forwarder, ForwarderLoop, ForwarderH1, ForwarderNethttp))
	}
	if o.Loops < 0 {
		errs = append(errs, fmt.Errorf("--loops %d must not be negative (0: one fewer than GOMAXPROCS)", o.Loops))
	}
	if o.MaxHeaderBytes < 1<<10 {
		errs = append(errs, fmt.Errorf("--max-header-bytes %d must be at least 1024", o.MaxHeaderBytes))
	}
	if o.MaxBodyBytes < 0 {
		errs = append(errs, fmt.Errorf("--max-body-bytes %d must not be negative (0: no limit)", o.MaxBodyBytes))
	}
	if o.MaxInFlight < 0 {
		errs = append(errs, fmt.Errorf("--max-in-flight %d must not be negative (0: no limit)", o.MaxInFlight))
	}
	if o.MaxIdleConnsPerHost < 1 {
		errs = append(errs, fmt.Errorf("--max-idle-conns-per-host %d must be at least 1", o.MaxIdleConnsPerHost))
	}
	return errs
}
