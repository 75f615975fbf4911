// Package benchplot draws the plots of `skipper-bench warm` from the
// warm.json it writes (docs/bench/warm.json): requests/s of the closed
// loop, the open loop's latency quantiles, and the proxies' CPU per
// request, each figure a median with its min–max range over the rounds.
//
// It is a module of its own, like tests/promql, so that gonum.org/v1/plot
// and its font and image dependencies stay out of the product's module
// graph. skipper-bench (main module) and this package share only the JSON:
// Report mirrors skipper-bench's warmReport, field names included.
package benchplot
