// Package procstat reads what the current process costs the machine: its
// CPU time across every thread (getrusage) and its resident set
// (/proc/self/statm). The scale benchmarks of the router and the
// controller measure with it; it holds no state and starts nothing.
//
// Linux only: the resident set comes from procfs.
package procstat
