package procstat

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// CPUTime returns the CPU time the process used so far, user and system,
// on every thread: a benchmark's share of the garbage collector included.
func CPUTime() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// Resident returns the process's resident set size in bytes.
func Resident() (uint64, error) {
	statm, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0, fmt.Errorf("read resident set: %w", err)
	}
	return parseStatm(string(statm), os.Getpagesize())
}

// parseStatm returns the resident set in bytes from the text of
// /proc/<pid>/statm (sizes in pages: total, resident, shared, …).
func parseStatm(statm string, pageSize int) (uint64, error) {
	f := strings.Fields(statm)
	if len(f) < 2 {
		return 0, fmt.Errorf("read resident set: statm %q has no resident field", statm)
	}
	pages, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("read resident set: statm %q: %w", statm, err)
	}
	return pages * uint64(pageSize), nil
}
