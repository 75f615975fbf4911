package benchplot

import (
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const sample = `{
  "date": "2026-12-01 08:00 UTC", "commit": "abc1234 (dirty)", "rounds": 5, "duration": "5s",
  "threads": 2, "connections": 64, "rate": 1000,
  "contenders": [
    {"name": "direct", "label": "direct", "closed_rps": {"median": 20000, "min": 19000, "max": 21000, "n": 5},
     "open_p50_ms": {"median": 0.3, "min": 0.25, "max": 0.35, "n": 5}, "open_p99_ms": {"median": 1.2, "min": 1, "max": 2, "n": 5},
     "open_p999_ms": {"median": 4, "min": 3, "max": 9, "n": 5}, "closed_cpu_us_per_req": {"n": 0}, "open_cpu_us_per_req": {"n": 0}},
    {"name": "router", "label": "router", "closed_rps": {"median": 9000, "min": 8500, "max": 9900, "n": 5},
     "open_p50_ms": {"median": 0.6, "min": 0.5, "max": 0.7, "n": 5}, "open_p99_ms": {"median": 2.2, "min": 2, "max": 3, "n": 5},
     "open_p999_ms": {"median": 6, "min": 5, "max": 12, "n": 5},
     "closed_cpu_us_per_req": {"median": 60, "min": 55, "max": 70, "n": 5}, "open_cpu_us_per_req": {"median": 90, "min": 80, "max": 100, "n": 5}}
  ]
}`

func TestReadAndPlot(t *testing.T) {
	rep, err := Read(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(Stat{Median: 60, Min: 55, Max: 70, N: 5}, rep.Contenders[1].ClosedCPU); diff != "" {
		t.Errorf("router closed CPU (-want +got):\n%s", diff)
	}
	dir := t.TempDir()
	files, err := Plot(rep, dir)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, f := range Files {
		want = append(want, filepath.Join(dir, f))
	}
	if diff := cmp.Diff(want, files); diff != "" {
		t.Errorf("files (-want +got):\n%s", diff)
	}
	for _, f := range files {
		r, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(r)
		r.Close()
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if b := img.Bounds(); b.Dx() < 200 || b.Dy() < 200 {
			t.Errorf("%s: %v, want a readable size", f, b)
		}
	}
}

func TestRead(t *testing.T) {
	for _, tc := range []struct{ name, in string }{
		{"not JSON", "{"},
		{"no contenders", `{"rounds": 5}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Read(strings.NewReader(tc.in)); err == nil {
				t.Error("no error")
			}
		})
	}
}

// TestSeriesDots: unmeasured figures get no dot; ranges are relative to
// the median, and x is the contender's index plus the offset.
func TestSeriesDots(t *testing.T) {
	cs := []Contender{
		{Name: "direct"},
		{Name: "router", ClosedCPU: Stat{Median: 60, Min: 55, Max: 70, N: 5}},
		{Name: "nan", ClosedCPU: Stat{Median: math.NaN(), N: 1}},
	}
	d := seriesDots(cs, series{"cpu", func(c Contender) Stat { return c.ClosedCPU }}, 0.2)
	if len(d.XYs) != 1 || d.XYs[0].X != 1.2 || d.XYs[0].Y != 60 {
		t.Fatalf("dots %v, want one at (1.2, 60)", d.XYs)
	}
	if lo, hi := d.YError(0); lo != 5 || hi != 10 {
		t.Errorf("range %v..%v, want 5..10", lo, hi)
	}
}
