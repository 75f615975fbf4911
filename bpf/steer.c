//go:build ignore

// steer.c: connect-time steering of calls to the skipper Service VIPs onto the
// node-local router. See doc.go for the contract with the Go loader; the map
// layouts here and the Go types bpf2go generates from them are that contract.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

char __license[] SEC("license") = "Dual MIT/GPL";

#define AF_INET 2
#define AF_INET6 10
#define IPPROTO_TCP 6
#define SOCK_STREAM 1

// Context fields are read through volatile so clang keeps one load per field
// at a constant offset; it otherwise may select between two field addresses
// and load through the result, which the verifier rejects ("dereference of
// modified ctx ptr").
#define CTX(field) (*(volatile __typeof__(field) *)&(field))

// An IPv4 address and TCP port, both in network byte order. pad is always 0
// so the struct can be a hash key.
struct addr4 {
	__u32 ip;
	__u16 port;
	__u16 pad;
};

// Written by the loader. A zero ip means "not configured": nothing is
// rewritten and nothing counted.
struct steer_config {
	// Liveness entries older than this (or missing, or in the future) make
	// every connect fail open.
	__u64 max_age_ns;
	// Where matched connects go (the node-local router).
	struct addr4 router;
	// Sockets carrying this SO_MARK (the router's own) are never rewritten.
	// 0 disables the check.
	__u32 skip_mark;
	// STEER_F_* bits.
	__u32 flags;
};

// STEER_F_REDIRECT: steered caller sockets and the router's accepted
// sockets join the socks sockhash, and steer_redirect moves their payload
// between them without the TCP/IP stack.
#define STEER_F_REDIRECT 1

// What a rewritten socket remembers: the VIP it aimed at and where it went
// instead.
struct orig {
	struct addr4 vip;
	struct addr4 to;
};

enum counter {
	COUNTER_REWRITE = 0,   // connect rewritten to the router
	COUNTER_FAIL_OPEN = 1, // VIP matched but the router was not live
	COUNTER_SKIP_OWN = 2,  // VIP matched on a socket carrying skip_mark
	COUNTER_REDIRECT = 3,  // sk_msg payload redirected to the peer socket
	COUNTER_MAX = 4,
};

// One end of a local connection: its own and its peer's IPv4 address and
// port, all in network byte order.
struct sock_key {
	__u32 local_ip;
	__u32 remote_ip;
	__u16 local_port;
	__u16 remote_port;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, struct addr4);
	__type(value, __u8);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} vips SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct steer_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} config SEC(".maps");

// liveness[0]: bpf_ktime_get_ns() (CLOCK_MONOTONIC) of the router's last
// heartbeat.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} liveness SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, COUNTER_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} counters SEC(".maps");

// Per rewritten socket: its original VIP. Freed with the socket.
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct orig);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} orig_vip SEC(".maps");

// Caller's local ip:port of an established rewritten connection -> the VIP
// it aimed at, so the router can tell which VIP an accepted connection was
// for. LRU: entries age out instead of being deleted on close.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct addr4);
	__type(value, struct addr4);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} orig_dst SEC(".maps");

// Steered callers' sockets and the router's sockets accepted from them, by
// their own 4-tuple (with STEER_F_REDIRECT). Sockets leave it when they
// close.
struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, 65536);
	__type(key, struct sock_key);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} socks SEC(".maps");

static __always_inline void count(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&counters, &idx);
	if (v)
		*v += 1;
}

// steer decides for a TCP connect to dst and returns where to send it, or
// NULL to leave the connect untouched. The socket's original VIP is
// remembered for getpeername and sockops.
static __always_inline struct addr4 *steer(struct bpf_sock_addr *ctx, struct addr4 *dst)
{
	__u32 zero = 0;

	if (!bpf_map_lookup_elem(&vips, dst))
		return NULL;

	struct steer_config *cfg = bpf_map_lookup_elem(&config, &zero);
	if (!cfg || cfg->router.ip == 0)
		return NULL;

	struct bpf_sock *sk = ctx->sk;
	if (!sk)
		return NULL;
	if (cfg->skip_mark != 0 && sk->mark == cfg->skip_mark) {
		count(COUNTER_SKIP_OWN);
		return NULL;
	}

	__u64 *last = bpf_map_lookup_elem(&liveness, &zero);
	__u64 now = bpf_ktime_get_ns();
	// A zero, stale or future timestamp all fail open: now - last wraps to a
	// huge age when last > now.
	if (!last || *last == 0 || now - *last > cfg->max_age_ns) {
		count(COUNTER_FAIL_OPEN);
		return NULL;
	}

	// Without storage (allocation failure) the connect is still steered;
	// only getpeername and sockops lose the VIP.
	struct orig *o = bpf_sk_storage_get(&orig_vip, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (o) {
		o->vip = *dst;
		o->to = cfg->router;
	}
	count(COUNTER_REWRITE);
	return &cfg->router;
}

static __always_inline int is_tcp(struct bpf_sock_addr *ctx)
{
	return ctx->type == SOCK_STREAM && ctx->protocol == IPPROTO_TCP;
}

static __always_inline int is_v4_mapped(struct bpf_sock_addr *ctx)
{
	return CTX(ctx->user_ip6[0]) == 0 && CTX(ctx->user_ip6[1]) == 0 &&
	       CTX(ctx->user_ip6[2]) == bpf_htonl(0x0000ffff);
}

SEC("cgroup/connect4")
int steer_connect4(struct bpf_sock_addr *ctx)
{
	if (!is_tcp(ctx))
		return 1;
	struct addr4 dst = {
		.ip = ctx->user_ip4,
		.port = (__u16)ctx->user_port,
	};
	struct addr4 *to = steer(ctx, &dst);
	if (to) {
		ctx->user_ip4 = to->ip;
		ctx->user_port = to->port;
	}
	return 1;
}

SEC("cgroup/connect6")
int steer_connect6(struct bpf_sock_addr *ctx)
{
	if (!is_tcp(ctx) || !is_v4_mapped(ctx))
		return 1;
	struct addr4 dst = {
		.ip = ctx->user_ip6[3],
		.port = (__u16)ctx->user_port,
	};
	struct addr4 *to = steer(ctx, &dst);
	if (to) {
		ctx->user_ip6[3] = to->ip;
		ctx->user_port = to->port;
	}
	return 1;
}

// restore returns the VIP to report as peer if this socket was steered and
// is still connected where it was steered to.
static __always_inline struct addr4 *restore(struct bpf_sock_addr *ctx, __u32 ip)
{
	struct bpf_sock *sk = ctx->sk;
	if (!sk)
		return NULL;
	struct orig *o = bpf_sk_storage_get(&orig_vip, sk, 0, 0);
	if (!o)
		return NULL;
	if (o->to.ip != ip || o->to.port != (__u16)ctx->user_port)
		return NULL;
	return &o->vip;
}

SEC("cgroup/getpeername4")
int steer_getpeername4(struct bpf_sock_addr *ctx)
{
	struct addr4 *vip = restore(ctx, ctx->user_ip4);
	if (vip) {
		ctx->user_ip4 = vip->ip;
		ctx->user_port = vip->port;
	}
	return 1;
}

SEC("cgroup/getpeername6")
int steer_getpeername6(struct bpf_sock_addr *ctx)
{
	if (!is_v4_mapped(ctx))
		return 1;
	struct addr4 *vip = restore(ctx, ctx->user_ip6[3]);
	if (vip) {
		ctx->user_ip6[3] = vip->ip;
		ctx->user_port = vip->port;
	}
	return 1;
}

// sock_key_of fills k from skops (local_port is in host byte order,
// remote_port in network byte order in the upper 16 bits) and reports
// whether the socket is IPv4 or v4-mapped.
static __always_inline int sock_key_of(struct bpf_sock_ops *skops, struct sock_key *k)
{
	// Every field is loaded unconditionally, before any branch: loads in
	// branches get tail-merged into one load through a computed pointer.
	__u32 family = CTX(skops->family);
	__u32 lport = CTX(skops->local_port);
	__u32 rport = CTX(skops->remote_port);
	__u32 lip4 = CTX(skops->local_ip4);
	__u32 rip4 = CTX(skops->remote_ip4);
	__u32 l6_0 = CTX(skops->local_ip6[0]);
	__u32 l6_1 = CTX(skops->local_ip6[1]);
	__u32 l6_2 = CTX(skops->local_ip6[2]);
	__u32 l6_3 = CTX(skops->local_ip6[3]);
	__u32 r6_0 = CTX(skops->remote_ip6[0]);
	__u32 r6_1 = CTX(skops->remote_ip6[1]);
	__u32 r6_2 = CTX(skops->remote_ip6[2]);
	__u32 r6_3 = CTX(skops->remote_ip6[3]);

	k->local_port = bpf_htons((__u16)lport);
	k->remote_port = (__u16)(rport >> 16);
	if (family == AF_INET) {
		k->local_ip = lip4;
		k->remote_ip = rip4;
		return 1;
	}
	if (family == AF_INET6 && l6_0 == 0 && l6_1 == 0 && l6_2 == bpf_htonl(0x0000ffff) &&
	    r6_0 == 0 && r6_1 == 0 && r6_2 == bpf_htonl(0x0000ffff)) {
		k->local_ip = l6_3;
		k->remote_ip = r6_3;
		return 1;
	}
	return 0;
}

SEC("sockops")
int steer_sockops(struct bpf_sock_ops *skops)
{
	__u32 op = CTX(skops->op);
	if (op != BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB && op != BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB)
		return 1;
	struct bpf_sock *sk = skops->sk;
	if (!sk)
		return 1;
	struct sock_key k = {};
	if (!sock_key_of(skops, &k))
		return 1;
	__u32 zero = 0;
	struct steer_config *cfg = bpf_map_lookup_elem(&config, &zero);
	int redirect = cfg && (cfg->flags & STEER_F_REDIRECT);

	if (op == BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB) {
		// The router accepting a connection on its steering address.
		if (redirect && k.local_ip == cfg->router.ip && k.local_port == cfg->router.port)
			bpf_sock_hash_update(skops, &socks, &k, BPF_ANY);
		return 1;
	}

	struct orig *o = bpf_sk_storage_get(&orig_vip, sk, 0, 0);
	if (!o)
		return 1;
	struct addr4 local = {.ip = k.local_ip, .port = k.local_port};
	struct addr4 vip = o->vip;
	bpf_map_update_elem(&orig_dst, &local, &vip, BPF_ANY);
	if (redirect)
		bpf_sock_hash_update(skops, &socks, &k, BPF_ANY);
	return 1;
}

// steer_redirect runs on every sendmsg of a socket in socks: the payload goes
// straight to the receive queue of the connection's other end when that is
// in socks too (a steered caller and the router), else through the stack.
SEC("sk_msg")
int steer_redirect(struct sk_msg_md *msg)
{
	__u32 lport = CTX(msg->local_port);
	__u32 rport = CTX(msg->remote_port);
	__u32 lip4 = CTX(msg->local_ip4);
	__u32 rip4 = CTX(msg->remote_ip4);
	struct sock_key peer = {
		.local_ip = rip4,
		.remote_ip = lip4,
		.local_port = (__u16)(rport >> 16),
		.remote_port = bpf_htons((__u16)lport),
	};
	if (bpf_msg_redirect_hash(msg, &socks, &peer, BPF_F_INGRESS) == SK_PASS)
		count(COUNTER_REDIRECT);
	return SK_PASS;
}
