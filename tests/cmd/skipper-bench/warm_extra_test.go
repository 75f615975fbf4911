package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseBenchmem(t *testing.T) {
	const out = `goos: linux
goarch: amd64
pkg: skipper.dev/skipper/noderouter
BenchmarkProxyWarmServed/loop-2         	   16298	     73270 ns/op	     202 B/op	       4 allocs/op
BenchmarkProxyWarmServed/h1-2           	   27238	     43680 ns/op	     218 B/op	       4 allocs/op
BenchmarkProxyWarmServed/loop-2         	   16000	     70000 ns/op	     240 B/op	       5 allocs/op
BenchmarkProxyWarmServed/nethttp-2      	   13755	     87315 ns/op	    7995 B/op	      89 allocs/op
BenchmarkNoMem-2                        	   10	     5 ns/op
PASS
ok  	skipper.dev/skipper/noderouter	3.670s
`
	rows, err := parseBenchmem(strings.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	want := []allocRow{
		{"BenchmarkProxyWarmServed/loop-2", 70000, 240, 5}, // the worse of two runs
		{"BenchmarkProxyWarmServed/h1-2", 43680, 218, 4},
		{"BenchmarkProxyWarmServed/nethttp-2", 87315, 7995, 89},
	}
	if len(rows) != len(want) {
		t.Fatalf("rows %+v, want %+v", rows, want)
	}
	for i := range want {
		if rows[i] != want[i] {
			t.Errorf("row %d: %+v, want %+v", i, rows[i], want[i])
		}
	}
	if _, err := parseBenchmem(strings.NewReader("PASS\nBenchmarkX-2 10 5 ns/op\n")); err == nil {
		t.Error("output without allocs/op: no error")
	}
	if _, err := parseBenchmem(strings.NewReader("BenchmarkX-2 10 x ns/op 1 allocs/op\n")); err == nil {
		t.Error("a bad number: no error")
	}
}

func TestReadAllocsNamesTheFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "allocs.txt")
	if err := os.WriteFile(p, []byte("FAIL\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readAllocs(p); err == nil || !strings.Contains(err.Error(), p) {
		t.Errorf("err %v, want one naming %s", err, p)
	}
}

func TestMarkdownVIPAndAllocs(t *testing.T) {
	rep := warmReport{Rounds: 1, VIPN: 1000,
		VIP:    []vipRow{{Path: "VIP via BPF (connect4 rewrite)", P50: stat{Median: 0.74, Min: 0.7, Max: 0.8, N: 5}, P99: stat{Median: 1.5, Min: 1.2, Max: 2, N: 5}, RPS: stat{Median: 1300, Min: 1200, Max: 1400, N: 5}, Errors: 0}},
		Allocs: []allocRow{{"BenchmarkProxyWarmServed/loop-2", 73270, 202, 4}},
	}
	md := rep.markdown(nil)
	for _, w := range []string{
		"| VIP via BPF (connect4 rewrite) | 0.740 ms (0.700–0.800) | 1.500 ms (1.200–2.000) | 1300 (1200–1400) | 0 |",
		"1000 sequential GETs per path",
		"| BenchmarkProxyWarmServed/loop-2 | 4 | 202 | 73270 |",
	} {
		if !strings.Contains(md, w) {
			t.Errorf("markdown lacks %q:\n%s", w, md)
		}
	}
	if md := (warmReport{Rounds: 1}).markdown(nil); strings.Contains(md, "Per new connection") || strings.Contains(md, "Allocations") {
		t.Errorf("sections without figures:\n%s", md)
	}
}
