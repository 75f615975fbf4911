// Package ring decides which controller replica owns a function.
//
// A Ring is an immutable consistent-hash ring over a member set (controller
// "ip:port" strings): every member is placed at VirtualNodes points hashed
// with xxhash64, and a key (a function's "namespace/name") belongs to the
// member at the first point at or after the key's hash, found by binary
// search. The epoch is a hash of the sorted member set, so every replica and
// router that sees the same members computes the same ring and epoch.
//
// Both the controller and the router build rings from the same source (the
// ready endpoints of the headless Service's EndpointSlices), through the one
// rule in MembersFromEndpointSlices, so the same slices give the same ring on
// either side. The package is pure: no I/O, no clock, safe for concurrent use
// once built; it reads Kubernetes EndpointSlice types but never a client.
package ring
