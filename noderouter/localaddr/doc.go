// Package localaddr keeps the router's node-local address (169.254.20.20/32
// by default) on the node: on a dummy link "skipper0", or, where the kernel
// cannot create dummy links (CONFIG_DUMMY off: RTM_NEWLINK fails with
// EOPNOTSUPP), as an address labelled "lo:skipper" on the loopback link.
//
// # Invariants
//
//   - Ensure is idempotent: it compares what is on the node with what is
//     wanted (Plan, a pure function of the observed state) and changes only
//     the difference. Running it twice changes nothing the second time.
//   - Ensure never removes addresses it did not add: only the wanted address,
//     on skipper0 or with the label lo:skipper, is ever touched.
//   - Remove (uninstall) deletes skipper0 and the labelled address on lo;
//     with neither present it does nothing and returns nil.
//   - Run reconciles on a timer until its context ends, so an address or
//     link removed by someone else comes back within one interval.
//
// # Driving it
//
//	m := &localaddr.Manager{Addr: netip.MustParseAddr("169.254.20.20")}
//	where, err := m.Ensure()          // before listening on the address
//	go m.Run(ctx, 10*time.Second, log) // owned by the caller, ends with ctx
//	err = m.Remove()                  // skipper-noderouter bpf-cleanup
//
// Manager.Handle selects the network namespace (a netlink.Handle opened in
// it, as tests do); nil means the calling process's namespace. Every call
// needs CAP_NET_ADMIN.
package localaddr
