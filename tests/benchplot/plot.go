package benchplot

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Stat is a figure over the rounds; N 0: not measured.
type Stat struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	N      int     `json:"n"`
}

// Contender is one contender's figures (latencies in ms, CPU in µs per
// request).
type Contender struct {
	Name      string `json:"name"`
	Label     string `json:"label"`
	ClosedRPS Stat   `json:"closed_rps"`
	ClosedP50 Stat   `json:"closed_p50_ms"`
	ClosedP99 Stat   `json:"closed_p99_ms"`
	ClosedCPU Stat   `json:"closed_cpu_us_per_req"`
	OpenP50   Stat   `json:"open_p50_ms"`
	OpenP99   Stat   `json:"open_p99_ms"`
	OpenP999  Stat   `json:"open_p999_ms"`
	OpenCPU   Stat   `json:"open_cpu_us_per_req"`
}

// Report is the part of warm.json the plots use.
type Report struct {
	Date        string      `json:"date"`
	Commit      string      `json:"commit"`
	Rounds      int         `json:"rounds"`
	Duration    string      `json:"duration"`
	Threads     int         `json:"threads"`
	Connections int         `json:"connections"`
	Rate        int         `json:"rate"`
	Contenders  []Contender `json:"contenders"`
}

// Read decodes a warm.json.
func Read(r io.Reader) (Report, error) {
	var rep Report
	if err := json.NewDecoder(r).Decode(&rep); err != nil {
		return rep, fmt.Errorf("warm.json: %w", err)
	}
	if len(rep.Contenders) == 0 {
		return rep, fmt.Errorf("warm.json: no contenders")
	}
	return rep, nil
}

// series is one kind of dot in a plot: a figure of every contender.
type series struct {
	name string
	get  func(Contender) Stat
}

// dots holds the medians at x (contender index + offset) and their ranges.
type dots struct {
	plotter.XYs
	plotter.YErrors
}

// seriesDots places s's measured figures; the x of contender i is
// i+offset.
func seriesDots(cs []Contender, s series, offset float64) dots {
	var d dots
	for i, c := range cs {
		st := s.get(c)
		if st.N == 0 || math.IsNaN(st.Median) {
			continue
		}
		d.XYs = append(d.XYs, plotter.XY{X: float64(i) + offset, Y: st.Median})
		d.YErrors = append(d.YErrors, struct{ Low, High float64 }{st.Median - st.Min, st.Max - st.Median})
	}
	return d
}

// Files are the plots Plot writes, in order.
var Files = []string{"warm-closed.png", "warm-open.png", "warm-cpu.png"}

// Plot writes Files into dir and returns their paths.
func Plot(rep Report, dir string) ([]string, error) {
	names := make([]string, len(rep.Contenders))
	for i, c := range rep.Contenders {
		names[i] = c.Name
	}
	sub := fmt.Sprintf("median and min–max of %d rounds, %s", rep.Rounds, rep.Commit)
	plots := []struct {
		title, y string
		log      bool
		series   []series
	}{
		{fmt.Sprintf("Closed loop: wrk -t%d -c%d -d%s (%s)", rep.Threads, rep.Connections, rep.Duration, sub), "requests/s", false,
			[]series{{"requests/s", func(c Contender) Stat { return c.ClosedRPS }}}},
		{fmt.Sprintf("Open loop: %d req/s for %s (%s)", rep.Rate, rep.Duration, sub), "latency (ms, log)", true,
			[]series{
				{"p50", func(c Contender) Stat { return c.OpenP50 }},
				{"p99", func(c Contender) Stat { return c.OpenP99 }},
				{"p99.9", func(c Contender) Stat { return c.OpenP999 }},
			}},
		{fmt.Sprintf("Proxy CPU per request (%s)", sub), "CPU µs / request", false,
			[]series{
				{"closed loop", func(c Contender) Stat { return c.ClosedCPU }},
				{fmt.Sprintf("open loop, %d req/s", rep.Rate), func(c Contender) Stat { return c.OpenCPU }},
			}},
	}
	var out []string
	for k, pl := range plots {
		p := plot.New()
		p.Title.Text = pl.title
		p.Title.TextStyle.Font.Size = vg.Points(10)
		p.Y.Label.Text = pl.y
		p.NominalX(names...)
		p.X.Min, p.X.Max = -0.5, float64(len(names))-0.5
		p.Add(plotter.NewGrid())
		if pl.log {
			p.Y.Scale = plot.LogScale{}
			p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
		} else {
			p.Y.Min = 0
		}
		p.Legend.Top = true
		for j, s := range pl.series {
			off := (float64(j) - float64(len(pl.series)-1)/2) * 0.2
			d := seriesDots(rep.Contenders, s, off)
			if len(d.XYs) == 0 {
				continue
			}
			if len(pl.series) == 1 {
				vals := make(plotter.Values, len(rep.Contenders))
				for i, c := range rep.Contenders {
					vals[i] = s.get(c).Median
				}
				bars, err := plotter.NewBarChart(vals, vg.Points(28))
				if err != nil {
					return nil, err
				}
				bars.Color = plotutil.Color(0)
				bars.LineStyle.Width = 0
				p.Add(bars)
			} else {
				sc, err := plotter.NewScatter(d)
				if err != nil {
					return nil, err
				}
				sc.GlyphStyle.Color = plotutil.Color(j)
				sc.GlyphStyle.Shape = plotutil.Shape(j)
				sc.GlyphStyle.Radius = vg.Points(3)
				p.Add(sc)
				p.Legend.Add(s.name, sc)
			}
			eb, err := plotter.NewYErrorBars(d)
			if err != nil {
				return nil, err
			}
			p.Add(eb)
		}
		f := filepath.Join(dir, Files[k])
		if err := p.Save(vg.Length(120+70*len(names))*vg.Millimeter/2, 90*vg.Millimeter, f); err != nil {
			return nil, fmt.Errorf("save %s: %w", f, err)
		}
		out = append(out, f)
	}
	return out, nil
}
