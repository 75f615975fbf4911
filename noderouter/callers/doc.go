// Package callers tells who a call comes from and whether a function
// allows it: the router's side of spec.callers.
//
// An Index maps pod IPs to the pods' identities (namespace and
// ServiceAccount), fed by a pod informer; a Policy is a function's callers
// as its controller sends them. Both are safe for concurrent use; a lookup
// takes a read lock and allocates nothing.
package callers
