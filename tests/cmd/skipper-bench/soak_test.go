package main

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestJudge(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name       string
		start, end usage
		wantOK     bool
		want       string
	}{
		{"unchanged", usage{100 * mib, 200, 1, 0}, usage{100 * mib, 200, 1, 0}, true, "PASS"},
		{"RSS +10% is in", usage{100 * mib, 200, 1, 0}, usage{110 * mib, 200, 1, 0}, true, "PASS"},
		{"RSS +11% is out", usage{100 * mib, 200, 1, 0}, usage{111 * mib, 200, 1, 0}, false, "FAIL (RSS)"},
		{"RSS -11% is out too", usage{100 * mib, 200, 1, 0}, usage{89 * mib, 200, 1, 0}, false, "FAIL (RSS)"},
		{"few goroutines: slack 20", usage{100 * mib, 40, 1, 0}, usage{100 * mib, 60, 1, 0}, true, "PASS"},
		{"few goroutines: past slack", usage{100 * mib, 40, 1, 0}, usage{100 * mib, 61, 1, 0}, false, "FAIL (goroutines)"},
		{"many goroutines: 10%", usage{100 * mib, 1000, 1, 0}, usage{100 * mib, 1100, 1, 0}, true, "PASS"},
		{"many goroutines: past 10%", usage{100 * mib, 1000, 1, 0}, usage{100 * mib, 1101, 1, 0}, false, "FAIL (goroutines)"},
		{"both", usage{100 * mib, 40, 1, 0}, usage{200 * mib, 400, 1, 0}, false, "FAIL (RSS, goroutines)"},
		{"restarted", usage{100 * mib, 200, 1, 0}, usage{100 * mib, 200, 2, 0}, false, "FAIL (restarted)"},
		{"no start time", usage{100 * mib, 200, 0, 0}, usage{100 * mib, 200, 0, 0}, true, "PASS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ok, got := judge(tc.start, tc.end)
			if ok != tc.wantOK {
				t.Errorf("judge ok = %v, want %v", ok, tc.wantOK)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("judge verdict (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMedianUsage(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []usage
		want usage
	}{
		{"one", []usage{{1, 2, 3, 0}}, usage{1, 2, 3, 0}},
		{"each field on its own", []usage{{5, 10, 7, 0}, {1, 30, 7, 0}, {3, 20, 7, 0}}, usage{3, 20, 7, 0}},
		{"even: mean of the middle two", []usage{{1, 1, 1, 0}, {2, 2, 1, 0}, {4, 4, 1, 0}, {9, 9, 1, 0}}, usage{3, 3, 1, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, medianUsage(tc.in), cmp.AllowUnexported(usage{})); diff != "" {
				t.Errorf("medianUsage (-want +got):\n%s", diff)
			}
		})
	}
}

func TestChange(t *testing.T) {
	for _, tc := range []struct {
		name       string
		start, end float64
		want       string
	}{
		{"up", 100, 104.44, "+4.4%"},
		{"down", 200, 190, "-5.0%"},
		{"same", 50, 50, "+0.0%"},
		{"from zero", 0, 3, "n/a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, change(tc.start, tc.end)); diff != "" {
				t.Errorf("change(%v, %v) (-want +got):\n%s", tc.start, tc.end, diff)
			}
		})
	}
}
