package attach

import (
	"fmt"
	"net/http"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Scrape returns the metric families a Prometheus endpoint exports, by
// name.
func Scrape(url string) (map[string]*dto.MetricFamily, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", url, err)
	}
	return fams, nil
}

// MetricSum scrapes url and sums the samples of metric whose labels include
// every pair in match. A metric url does not export is an error.
func MetricSum(url, metric string, match map[string]string) (float64, error) {
	fams, err := Scrape(url)
	if err != nil {
		return 0, err
	}
	fam, ok := fams[metric]
	if !ok {
		return 0, fmt.Errorf("%s does not export %s", url, metric)
	}
	return SumFamily(fam, match), nil
}

// CounterSum is MetricSum for a labelled counter whose series appear on
// first use: a metric url does not export yet counts as zero.
func CounterSum(url, metric string, match map[string]string) (float64, error) {
	fams, err := Scrape(url)
	if err != nil {
		return 0, err
	}
	return SumFamily(fams[metric], match), nil
}

// SumFamily sums the samples of fam (nil: none) whose labels include every
// pair in match.
func SumFamily(fam *dto.MetricFamily, match map[string]string) float64 {
	var sum float64
next:
	for _, m := range fam.GetMetric() {
		for k, v := range match {
			found := false
			for _, lp := range m.GetLabel() {
				if lp.GetName() == k && lp.GetValue() == v {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Untyped != nil:
			sum += m.GetUntyped().GetValue()
		}
	}
	return sum
}
