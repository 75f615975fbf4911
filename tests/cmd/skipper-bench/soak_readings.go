package main

import (
	"context"
	"fmt"
	"math"
	"net/url"
	"slices"
	"strings"

	// Named for what it gives here: main.go has a func attach.
	metrics "skipper.dev/skipper/tests/attach"
)

// process is one process whose memory and goroutines the soak watches.
type process struct {
	name string
	url  string // its Prometheus endpoint
}

// usage is a process's state in one reading.
type usage struct {
	rss        float64 // process_resident_memory_bytes
	goroutines float64 // go_goroutines
	started    float64 // process_start_time_seconds; 0: not exported
	heap       float64 // go_memstats_heap_inuse_bytes (shown, not judged)
}

// soakProcesses lists the processes the env file gives metrics endpoints
// of: node 1's router and each controller replica.
func soakProcesses(env map[string]string) []process {
	procs := []process{{name: "router " + hostOf(env["ROUTER_METRICS_URL"]), url: env["ROUTER_METRICS_URL"]}}
	for _, u := range strings.Fields(env["CONTROLLER_METRICS_URLS"]) {
		procs = append(procs, process{name: "controller " + hostOf(u), url: u})
	}
	return procs
}

func hostOf(rawURL string) string {
	if u, err := url.Parse(rawURL); err == nil && u.Host != "" {
		return u.Host
	}
	return rawURL
}

// read takes soakReadings readings of every process, soakReadingGap apart,
// and returns each process's median.
func read(ctx context.Context, procs []process) ([]usage, error) {
	samples := make([][]usage, len(procs))
	for r := range soakReadings {
		if r > 0 {
			if err := pause(ctx, soakReadingGap); err != nil {
				return nil, err
			}
		}
		for i, p := range procs {
			u, err := readUsage(p.url)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", p.name, err)
			}
			samples[i] = append(samples[i], u)
		}
	}
	out := make([]usage, len(procs))
	for i, s := range samples {
		out[i] = medianUsage(s)
	}
	return out, nil
}

// readUsage scrapes one process's metrics endpoint.
func readUsage(metricsURL string) (usage, error) {
	fams, err := metrics.Scrape(metricsURL)
	if err != nil {
		return usage{}, err
	}
	for _, m := range []string{"process_resident_memory_bytes", "go_goroutines"} {
		if fams[m] == nil {
			return usage{}, fmt.Errorf("%s does not export %s", metricsURL, m)
		}
	}
	return usage{
		rss:        metrics.SumFamily(fams["process_resident_memory_bytes"], nil),
		heap:       metrics.SumFamily(fams["go_memstats_heap_inuse_bytes"], nil),
		goroutines: metrics.SumFamily(fams["go_goroutines"], nil),
		started:    metrics.SumFamily(fams["process_start_time_seconds"], nil),
	}, nil
}

// medianUsage is the median of each field of us (not empty) on its own.
func medianUsage(us []usage) usage {
	field := func(f func(usage) float64) float64 {
		xs := make([]float64, len(us))
		for i, u := range us {
			xs[i] = f(u)
		}
		return median(xs)
	}
	return usage{
		rss:        field(func(u usage) float64 { return u.rss }),
		heap:       field(func(u usage) float64 { return u.heap }),
		goroutines: field(func(u usage) float64 { return u.goroutines }),
		started:    field(func(u usage) float64 { return u.started }),
	}
}

// median of xs (not empty); for an even count, the mean of the middle two.
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// judge says whether a process came back to its starting level: RSS
// within ±soakTolerance, goroutines within ±soakTolerance or
// ±soakGoroutineSlack, whichever is wider, and no restart in between (a
// restart would hide a leak). It returns the verdict for the table.
func judge(start, end usage) (bool, string) {
	if start.started != 0 && end.started != 0 && start.started != end.started {
		return false, "FAIL (restarted)"
	}
	var bad []string
	if !within(start.rss, end.rss, 0) {
		bad = append(bad, "RSS")
	}
	if !within(start.goroutines, end.goroutines, soakGoroutineSlack) {
		bad = append(bad, "goroutines")
	}
	if len(bad) > 0 {
		return false, "FAIL (" + strings.Join(bad, ", ") + ")"
	}
	return true, "PASS"
}

func within(start, end, slack float64) bool {
	return math.Abs(end-start) <= max(soakTolerance*start, slack)
}

// change is end's difference from start in percent, signed.
func change(start, end float64) string {
	if start == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%+.1f%%", (end-start)/start*100)
}
