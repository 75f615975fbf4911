package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// wrkResult is what one `wrk --latency` run printed.
type wrkResult struct {
	Requests int64         // "N requests in 5.00s"
	Elapsed  time.Duration // the "in 5.00s" of that line
	RPS      float64       // "Requests/sec:"
	P50, P99 time.Duration // "Latency Distribution"
	Errors   int64         // socket errors (connect, read, write, timeout) + non-2xx/3xx answers
}

// parseWrk reads the text `wrk --latency` prints. Requests, the elapsed
// time, requests/s and the p50 and p99 lines are required; the error lines
// are only printed when there were errors.
func parseWrk(out string) (wrkResult, error) {
	var r wrkResult
	var have struct{ req, rps, p50, p99 bool }
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) >= 4 && f[1] == "requests" && f[2] == "in":
			n, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				return r, fmt.Errorf("wrk requests line %q: %w", sc.Text(), err)
			}
			d, err := parseWrkDuration(strings.TrimSuffix(f[3], ","))
			if err != nil {
				return r, fmt.Errorf("wrk requests line %q: %w", sc.Text(), err)
			}
			r.Requests, r.Elapsed, have.req = n, d, true
		case len(f) == 2 && f[0] == "Requests/sec:":
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				return r, fmt.Errorf("wrk line %q: %w", sc.Text(), err)
			}
			r.RPS, have.rps = v, true
		case len(f) == 2 && (f[0] == "50%" || f[0] == "99%"):
			d, err := parseWrkDuration(f[1])
			if err != nil {
				return r, fmt.Errorf("wrk latency line %q: %w", sc.Text(), err)
			}
			if f[0] == "50%" {
				r.P50, have.p50 = d, true
			} else {
				r.P99, have.p99 = d, true
			}
		case len(f) >= 3 && f[0] == "Socket" && f[1] == "errors:":
			// Socket errors: connect 0, read 0, write 0, timeout 0
			for i := 2; i+1 < len(f); i += 2 {
				n, err := strconv.ParseInt(strings.TrimSuffix(f[i+1], ","), 10, 64)
				if err != nil {
					return r, fmt.Errorf("wrk line %q: %w", sc.Text(), err)
				}
				r.Errors += n
			}
		case strings.HasPrefix(strings.TrimSpace(sc.Text()), "Non-2xx or 3xx responses:"):
			n, err := strconv.ParseInt(f[len(f)-1], 10, 64)
			if err != nil {
				return r, fmt.Errorf("wrk line %q: %w", sc.Text(), err)
			}
			r.Errors += n
		}
	}
	if !have.req || !have.rps || !have.p50 || !have.p99 {
		return r, fmt.Errorf("wrk output lacks requests, Requests/sec or the 50%%/99%% latency lines (run with --latency): %q", out)
	}
	return r, nil
}

// parseWrkDuration reads wrk's durations: a number and one of the units
// us, ms, s, m, h ("812.00us", "1.23ms", "5.00s", "1.00m").
func parseWrkDuration(s string) (time.Duration, error) {
	for _, u := range []struct {
		suffix string
		unit   time.Duration
	}{{"us", time.Microsecond}, {"ms", time.Millisecond}, {"s", time.Second}, {"m", time.Minute}, {"h", time.Hour}} {
		if num, ok := strings.CutSuffix(s, u.suffix); ok {
			v, err := strconv.ParseFloat(num, 64)
			if err != nil {
				return 0, fmt.Errorf("duration %q: %w", s, err)
			}
			return time.Duration(v * float64(u.unit)), nil
		}
	}
	return 0, fmt.Errorf("duration %q: no unit", s)
}

// openResult is what one warm-open run prints: every request's latency
// from its scheduled start (so a stalled server is charged for the requests
// that queued behind it, as wrk2 does), after the warm-up.
type openResult struct {
	Total    int             `json:"total"` // sent, the warm-up's included
	Sent     int             `json:"sent"`  // sent after the warm-up: the recorded ones
	OK       int             `json:"ok"`
	Errors   int             `json:"errors"`
	FirstErr string          `json:"first_error,omitempty"`
	Elapsed  time.Duration   `json:"elapsed"`
	Lat      []time.Duration `json:"latencies"`
}

// openWarmup is how long warm-open sends at the rate before it records:
// the first requests open the connections.
const openWarmup = 500 * time.Millisecond

// runWarmOpen is the open-loop generator `skipper-bench warm` starts (in
// the caller's network namespace and cgroup, like vip-client): GETs to url
// at a fixed rate, each started at its scheduled time whatever the earlier
// ones are doing, over kept-alive connections (a new one only while all are
// busy). It prints an openResult as JSON.
func runWarmOpen(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("warm-open", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", "", "target URL")
	rate := fs.Int("rate", 1000, "requests per second")
	d := fs.Duration("duration", 5*time.Second, "how long to record (after a warm-up of "+openWarmup.String()+")")
	conns := fs.Int("connections", 64, "kept-alive connections kept idle between requests")
	function := fs.String("function", "", "x-skipper-function header; empty: none")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *url == "" || *rate < 1 || *d <= 0 {
		return fmt.Errorf("-url, a -rate of at least 1 and a positive -duration are required")
	}
	tr := &http.Transport{Proxy: nil, MaxIdleConnsPerHost: *conns, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Timeout: 10 * time.Second, Transport: tr}
	res := openResult{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	interval := time.Second / time.Duration(*rate)
	warm := int(openWarmup / interval)
	total := warm + int(*d/interval)
	start := time.Now()
	for i := range total {
		at := start.Add(time.Duration(i) * interval)
		if w := time.Until(at); w > 0 {
			select {
			case <-ctx.Done():
				wg.Wait()
				return ctx.Err()
			case <-time.After(w):
			}
		}
		record := i >= warm
		res.Total++
		wg.Go(func() {
			err := get(ctx, client, *url, *function)
			lat := time.Since(at)
			if !record {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			res.Sent++
			if err != nil {
				if res.Errors++; res.FirstErr == "" {
					res.FirstErr = err.Error()
				}
				return
			}
			res.OK++
			res.Lat = append(res.Lat, lat)
		})
	}
	wg.Wait()
	res.Elapsed = time.Since(start.Add(openWarmup))
	return json.NewEncoder(stdout).Encode(res)
}

// get makes one GET and reads the whole answer; anything but 200 is an error.
func get(ctx context.Context, c *http.Client, url, function string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	if function != "" {
		req.Header.Set("x-skipper-function", function)
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return err
}

// cpuMeter returns a reading of the CPU used so far by the processes in
// the cgroup dir; nil for "".
func cpuMeter(dir string) func() (time.Duration, error) {
	if dir == "" {
		return nil
	}
	return func() (time.Duration, error) { return cgroupCPU(dir) }
}

// measure runs f and returns its result with the CPU cpu counted during
// it; -1 when cpu is nil.
func measure[T any](cpu func() (time.Duration, error), f func() (T, error)) (T, time.Duration, error) {
	var zero T
	if cpu == nil {
		r, err := f()
		return r, -1, err
	}
	before, err := cpu()
	if err != nil {
		return zero, 0, err
	}
	r, err := f()
	if err != nil {
		return zero, 0, err
	}
	after, err := cpu()
	if err != nil {
		return zero, 0, err
	}
	return r, after - before, nil
}

// runWrk runs wrk against c for d from c's caller placement.
func runWrk(ctx context.Context, bin string, c contender, cfg warmConfig, d time.Duration) (wrkResult, error) {
	args := []string{"-t", strconv.Itoa(cfg.Threads), "-c", strconv.Itoa(cfg.Connections),
		"-d", fmt.Sprintf("%ds", int(d/time.Second)), "--latency", "--timeout", "5s"}
	if c.function != "" {
		args = append(args, "-H", "x-skipper-function: "+c.function)
	}
	ctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()
	cmd := c.client.command(ctx, bin, append(args, c.url)...)
	var errb strings.Builder
	cmd.Stderr = &errb
	out, err := cmd.Output()
	if err != nil {
		return wrkResult{}, fmt.Errorf("wrk: %w: %s", err, strings.TrimSpace(errb.String()))
	}
	return parseWrk(string(out))
}

// runOpen runs the open-loop generator (this binary's warm-open) against c
// from c's caller placement.
func runOpen(ctx context.Context, self string, c contender, cfg warmConfig) (openResult, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.Duration+openWarmup+30*time.Second)
	defer cancel()
	cmd := c.client.command(ctx, self, "warm-open", "-url", c.url, "-rate", strconv.Itoa(cfg.Rate),
		"-duration", cfg.Duration.String(), "-connections", strconv.Itoa(cfg.Connections), "-function", c.function)
	var errb strings.Builder
	cmd.Stderr = &errb
	out, err := cmd.Output()
	if err != nil {
		return openResult{}, fmt.Errorf("warm-open: %w: %s", err, strings.TrimSpace(errb.String()))
	}
	var r openResult
	if err := json.Unmarshal(out, &r); err != nil {
		return r, fmt.Errorf("warm-open output: %w", err)
	}
	return r, nil
}
