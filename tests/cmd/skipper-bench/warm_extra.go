package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// allocRow is one benchmark's line of `go test -bench -benchmem` output:
// the router's BenchmarkProxyWarmServed per forwarder (the allocations of
// one warm request through its served path, issue 14).
type allocRow struct {
	Name        string  `json:"name"`
	NsPerOp     float64 `json:"ns_per_op"`
	BytesPerOp  float64 `json:"bytes_per_op"`
	AllocsPerOp float64 `json:"allocs_per_op"`
}

// parseBenchmem reads the benchmark lines of `go test -bench -benchmem`
// output ("BenchmarkX/sub-2  16298  73270 ns/op  202 B/op  4 allocs/op").
// A benchmark run more than once (-count) keeps its largest allocs/op and
// the ns/op and B/op of the same line. Lines without allocs/op are
// skipped; output without any is an error (-benchmem missing, or no
// benchmark matched).
func parseBenchmem(r io.Reader) ([]allocRow, error) {
	var rows []allocRow
	at := map[string]int{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		row := allocRow{Name: f[0], AllocsPerOp: -1}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return nil, fmt.Errorf("benchmark line %q: %w", sc.Text(), err)
			}
			switch f[i+1] {
			case "ns/op":
				row.NsPerOp = v
			case "B/op":
				row.BytesPerOp = v
			case "allocs/op":
				row.AllocsPerOp = v
			}
		}
		if row.AllocsPerOp < 0 {
			continue
		}
		if i, ok := at[row.Name]; ok {
			if row.AllocsPerOp > rows[i].AllocsPerOp {
				rows[i] = row
			}
			continue
		}
		at[row.Name] = len(rows)
		rows = append(rows, row)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("no benchmark line with allocs/op (run go test with -benchmem)")
	}
	return rows, nil
}

// readAllocs parses the benchmark output in file.
func readAllocs(file string) ([]allocRow, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rows, err := parseBenchmem(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return rows, nil
}

// allocsTable renders the rows as a markdown table.
func allocsTable(rows []allocRow) string {
	var b strings.Builder
	b.WriteString("| benchmark | allocs / request | bytes / request | ns / request |\n|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %.0f | %.0f | %.0f |\n", r.Name, r.AllocsPerOp, r.BytesPerOp, r.NsPerOp)
	}
	return b.String()
}
