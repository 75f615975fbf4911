package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// userHZ is the unit of utime and stime in /proc/<pid>/stat: USER_HZ,
// which the kernel fixes at 100 for that interface on every architecture
// Go runs Linux on (sysconf(_SC_CLK_TCK) reports it; Go has no sysconf).
const userHZ = 100

// parseStatCPU returns utime+stime, in clock ticks, from the text of
// /proc/<pid>/stat. The command name (field 2) is in parentheses and may
// hold spaces and parentheses itself, so fields are counted from the last
// ')': utime and stime are fields 14 and 15 of the whole line.
func parseStatCPU(stat []byte) (int64, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("stat %q: no ')'", stat)
	}
	f := strings.Fields(string(stat[i+1:]))
	// f[0] is field 3 (state): field n is f[n-3].
	if len(f) < 13 {
		return 0, fmt.Errorf("stat %q: %d fields after the name, want at least 13", stat, len(f))
	}
	var sum int64
	for _, s := range f[11:13] {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("stat %q: %w", stat, err)
		}
		sum += v
	}
	return sum, nil
}

// cgroupCPU is the CPU time (user + system, all threads) the processes in
// the cgroup dir and its descendants have used so far, read from each
// one's /proc/<pid>/stat. A process that exits between the listing and
// its stat is skipped: its time is lost, so measure long-lived processes.
func cgroupCPU(dir string) (time.Duration, error) {
	var ticks int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || d.Name() != "cgroup.procs" {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			stat, err := os.ReadFile(filepath.Join("/proc", strings.TrimSpace(sc.Text()), "stat"))
			if err != nil {
				continue // exited
			}
			t, err := parseStatCPU(stat)
			if err != nil {
				return err
			}
			ticks += t
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("CPU of cgroup %s: %w", dir, err)
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// stat is a figure over the rounds: the median and the range.
type stat struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	N      int     `json:"n"`
}

// summarize returns the median (the mean of the middle two of an even
// count) and the range of vs; NaNs (a round without the figure) are left
// out. No values: N is 0.
func summarize(vs []float64) stat {
	s := slices.DeleteFunc(slices.Clone(vs), math.IsNaN)
	if len(s) == 0 {
		return stat{}
	}
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return stat{Median: m, Min: s[0], Max: s[len(s)-1], N: len(s)}
}

// quantile returns the q-quantile (0 < q ≤ 1) of sorted by the nearest-rank
// method: the smallest value with at least q of all values at or below it.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(q * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

// sortedCopy returns ds sorted, leaving ds as it was.
func sortedCopy(ds []time.Duration) []time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s
}
