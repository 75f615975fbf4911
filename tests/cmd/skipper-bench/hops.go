package main

// hops measures what the machine alone charges a cold call: the hops of
// coldstart's first call (caller → router → controller → instance →
// controller → router → instance → router → caller) and of its second
// (caller → router → instance → router → caller) as bare TCP round trips
// of 256 bytes between idle processes that do no work, each started in the
// network namespace of the part it stands for (the router's node, a
// controller pod, a warm pool pod). The first / second ratio it prints is
// the floor of coldstart's ratio on this machine and topology: Skipper's
// own work comes on top of it.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"skipper.dev/skipper/controller/api/v1alpha1"
	podattach "skipper.dev/skipper/tests/attach"
	"skipper.dev/skipper/tests/linuxhost"
)

// hopSize is the size of every message of the chain, both ways.
const hopSize = 256

// The chain's messages: the first byte says what the router does.
const (
	hopCold byte = 'c' // ask the controller, then the instance
	hopWarm byte = 'w' // the instance only
)

// The roles' ports, in each role's own network namespace.
const (
	hopsRouterPort     = 17101
	hopsControllerPort = 17102
	hopsInstancePort   = 17103
)

func runHops(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("hops", flag.ContinueOnError)
	fs.SetOutput(stderr)
	n := fs.Int("n", 40, "cold/warm pairs per controller")
	idle := fs.Duration("idle", 300*time.Millisecond, "idle time before each cold call (every role idles with it)")
	pool := fs.String("pool", "echo", "pool whose warm pod's namespace the instance role runs in")
	ns := fs.String("namespace", "default", "namespace of the pool")
	envFile := fs.String("env", ".skipper/env", "the local cluster's env file")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: skipper-bench hops [flags]\n\n"+
			"Times coldstart's hops as bare TCP round trips between idle processes that do no work, each in the network\n"+
			"namespace of the part it stands for (node 1's router, each controller pod in turn, a warm pool pod):\n"+
			"the floor of coldstart's first/second ratio on this machine. Needs root (nsenter).")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *n < 1 || *idle < 0 {
		return fmt.Errorf("-n must be at least 1 and -idle not negative (got %d, %s)", *n, *idle)
	}
	env, _, cs, err := attach(*envFile, "ROUTER_URL")
	if err != nil {
		return err
	}
	routerIP, err := hostOfURL(env["ROUTER_URL"])
	if err != nil {
		return err
	}
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	node := ""
	for _, nd := range nodes.Items {
		for _, a := range nd.Status.Addresses {
			if a.Address == routerIP {
				node = nd.Name
			}
		}
	}
	if node == "" {
		return fmt.Errorf("no node has the router's address %s", routerIP)
	}
	ctrls, err := cs.CoreV1().Pods("skipper-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=skipper-controller"})
	if err != nil {
		return fmt.Errorf("list controllers: %w", err)
	}
	pods, err := cs.CoreV1().Pods(*ns).List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelPool + "=" + *pool + ",!" + v1alpha1.LabelFunction})
	if err != nil {
		return fmt.Errorf("list pool pods: %w", err)
	}
	inst := slices.IndexFunc(pods.Items, func(p corev1.Pod) bool { return ready(p) })
	if inst < 0 {
		return fmt.Errorf("pool %s/%s has no ready warm pod", *ns, *pool)
	}
	netns, err := netnsNames(ctx)
	if err != nil {
		return err
	}
	routerNS, err := findNetns(netns, func(s string) bool { return strings.HasSuffix(s, "-"+node) })
	if err != nil {
		return fmt.Errorf("node %s: %w", node, err)
	}
	instPod := pods.Items[inst]
	instNS, err := podattach.PodNetns(&instPod)
	if err != nil {
		return fmt.Errorf("pool pod %s: %w", instPod.Name, err)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	start := func(ctx context.Context, netns string, args ...string) (*exec.Cmd, error) {
		// nsenter, not ip netns exec: that remounts /sys, hiding the
		// cgroup v1 mounts, and takes only names, not a pod's /proc path.
		cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + linuxhost.NetnsPath(netns), "--", self, "hops-role"}, args...)...)
		cmd.Stderr = stderr
		return cmd, cmd.Start()
	}
	instAddr := net.JoinHostPort(instPod.Status.PodIP, fmt.Sprint(hopsInstancePort))
	fmt.Fprintf(stdout, "hops: bare TCP, %d-byte messages, %s idle before each cold call; router role in %s, instance role in pool pod %s (%s)\n",
		hopSize, *idle, routerNS, instPod.Name, instPod.Spec.NodeName)
	ictx, stopInst := context.WithCancel(ctx)
	defer stopInst()
	ic, err := start(ictx, instNS, "-role", "instance", "-listen", fmt.Sprintf(":%d", hopsInstancePort))
	if err != nil {
		return fmt.Errorf("start the instance role: %w", err)
	}
	defer func() { stopInst(); _ = ic.Wait() }()
	measured := 0
	for _, c := range ctrls.Items {
		if !ready(c) {
			continue
		}
		measured++
		cNS, err := podattach.PodNetns(&c)
		if err != nil {
			return fmt.Errorf("controller %s: %w", c.Name, err)
		}
		cold, warm, err := hopsThrough(ctx, start, routerNS, cNS, routerIP, c.Status.PodIP, instAddr, *n, *idle)
		if err != nil {
			return fmt.Errorf("through controller %s: %w", c.Name, err)
		}
		fmt.Fprintf(stdout, "  controller %s (%s): first p50 %s, second p50 %s: %.1f×\n", c.Name, c.Spec.NodeName,
			p50(cold).Round(time.Microsecond), p50(warm).Round(time.Microsecond), float64(p50(cold))/float64(p50(warm)))
	}
	if measured == 0 {
		return errors.New("no ready controller pod in skipper-system to measure through")
	}
	return nil
}

// hopsThrough runs the controller and router roles for one controller pod
// and times n cold/warm pairs through them.
func hopsThrough(ctx context.Context, start func(context.Context, string, ...string) (*exec.Cmd, error),
	routerNS, ctrlNS, routerIP, ctrlIP, instAddr string, n int, idle time.Duration) (cold, warm []time.Duration, err error) {
	ctx, cancel := context.WithCancel(ctx)
	var cmds []*exec.Cmd
	defer func() {
		cancel()
		for _, c := range cmds {
			_ = c.Wait()
		}
	}()
	ctrlAddr := net.JoinHostPort(ctrlIP, fmt.Sprint(hopsControllerPort))
	c, err := start(ctx, ctrlNS, "-role", "controller", "-listen", fmt.Sprintf(":%d", hopsControllerPort), "-instance", instAddr)
	if err != nil {
		return nil, nil, fmt.Errorf("start the controller role: %w", err)
	}
	cmds = append(cmds, c)
	r, err := start(ctx, routerNS, "-role", "router", "-listen", fmt.Sprintf(":%d", hopsRouterPort), "-instance", instAddr, "-controller", ctrlAddr)
	if err != nil {
		return nil, nil, fmt.Errorf("start the router role: %w", err)
	}
	cmds = append(cmds, r)
	conn, err := dialRetry(ctx, net.JoinHostPort(routerIP, fmt.Sprint(hopsRouterPort)), 10*time.Second)
	if err != nil {
		return nil, nil, err
	}
	defer conn.Close()
	return timeHops(ctx, conn, n, idle)
}

// timeHops times n cold/warm pairs on conn to a router role.
func timeHops(ctx context.Context, conn net.Conn, n int, idle time.Duration) (cold, warm []time.Duration, err error) {
	buf := make([]byte, hopSize)
	one := func(kind byte) (time.Duration, error) {
		t := time.Now()
		if err := roundTrip(conn, buf, kind); err != nil {
			return 0, err
		}
		return time.Since(t), nil
	}
	for range n {
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(idle):
		}
		c, err := one(hopCold)
		if err != nil {
			return nil, nil, fmt.Errorf("cold round trip: %w", err)
		}
		w, err := one(hopWarm)
		if err != nil {
			return nil, nil, fmt.Errorf("warm round trip: %w", err)
		}
		cold, warm = append(cold, c), append(warm, w)
	}
	return cold, warm, nil
}

// runHopsRole is one process of the chain (hops-role): it serves -listen
// until killed.
func runHopsRole(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("hops-role", flag.ContinueOnError)
	fs.SetOutput(stderr)
	role := fs.String("role", "", "router, controller or instance")
	listen := fs.String("listen", "", "address to serve")
	instance := fs.String("instance", "", "the instance role's address (router, controller)")
	controller := fs.String("controller", "", "the controller role's address (router)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", *listen, err)
	}
	h, err := hopsHandler(ctx, *role, *instance, *controller)
	if err != nil {
		ln.Close()
		return err
	}
	return serveHops(ctx, ln, h)
}

// hopsHandler returns what role does with each message before it answers:
// the instance nothing, the controller a round trip to the instance, the
// router one to the controller for a cold message and one to the instance.
func hopsHandler(ctx context.Context, role, instance, controller string) (func(kind byte) error, error) {
	dial := func(addr string) (func(kind byte) error, error) {
		c, err := dialRetry(ctx, addr, 10*time.Second)
		if err != nil {
			return nil, err
		}
		buf := make([]byte, hopSize)
		return func(kind byte) error { return roundTrip(c, buf, kind) }, nil
	}
	switch role {
	case "instance":
		return func(byte) error { return nil }, nil
	case "controller":
		return dial(instance)
	case "router":
		toInst, err := dial(instance)
		if err != nil {
			return nil, err
		}
		toCtrl, err := dial(controller)
		if err != nil {
			return nil, err
		}
		return func(kind byte) error {
			if kind == hopCold {
				if err := toCtrl(kind); err != nil {
					return err
				}
			}
			return toInst(kind)
		}, nil
	}
	return nil, fmt.Errorf("-role %q: want router, controller or instance", role)
}

// serveHops answers each hopSize message on each connection to ln once h
// has run, until ctx ends.
func serveHops(ctx context.Context, ln net.Listener, h func(kind byte) error) error {
	go func() { <-ctx.Done(); ln.Close() }()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		go func() {
			defer c.Close()
			buf := make([]byte, hopSize)
			for {
				if _, err := io.ReadFull(c, buf); err != nil {
					return
				}
				if err := h(buf[0]); err != nil {
					return
				}
				if _, err := c.Write(buf); err != nil {
					return
				}
			}
		}()
	}
}

// hopTimeout bounds one round trip of the chain: a role that stops
// answering fails the run rather than hang it.
const hopTimeout = 5 * time.Second

// roundTrip sends one message of kind on c and reads the answer into buf.
func roundTrip(c net.Conn, buf []byte, kind byte) error {
	if err := c.SetDeadline(time.Now().Add(hopTimeout)); err != nil {
		return err
	}
	buf[0] = kind
	if _, err := c.Write(buf); err != nil {
		return err
	}
	_, err := io.ReadFull(c, buf)
	return err
}

// dialRetry dials addr until it answers or wait passes (a role just
// started may not listen yet).
func dialRetry(ctx context.Context, addr string, wait time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			return c, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("dial %s: %w", addr, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// netnsNames lists the named network namespaces (ip netns list).
func netnsNames(ctx context.Context) ([]string, error) {
	out, err := exec.CommandContext(ctx, "ip", "netns", "list").Output()
	if err != nil {
		return nil, fmt.Errorf("ip netns list: %w", err)
	}
	var names []string
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			names = append(names, f[0])
		}
	}
	return names, nil
}

// findNetns returns the one name match accepts.
func findNetns(names []string, match func(string) bool) (string, error) {
	var found []string
	for _, n := range names {
		if match(n) {
			found = append(found, n)
		}
	}
	if len(found) != 1 {
		return "", fmt.Errorf("want one network namespace, found %d: %v", len(found), found)
	}
	return found[0], nil
}

// hostOfURL returns the host of an http URL such as ROUTER_URL.
func hostOfURL(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Hostname() == "" {
		return "", fmt.Errorf("ROUTER_URL %q: not a URL with a host (%v)", raw, err)
	}
	return u.Hostname(), nil
}

// p50 is the median of ds by nearest rank (warm_stat.go's quantile).
func p50(ds []time.Duration) time.Duration { return quantile(sortedCopy(ds), 0.5) }
