// Command skipper-benchplot draws docs/bench/warm-*.png from the warm.json
// `skipper-bench warm` writes, and prints the paths it wrote, one a line.
//
//	skipper-benchplot -in docs/bench/warm.json -out docs/bench
package main

import (
	"flag"
	"fmt"
	"os"

	"skipper.dev/skipper/tests/benchplot"
)

func main() {
	in := flag.String("in", "docs/bench/warm.json", "warm.json written by skipper-bench warm")
	out := flag.String("out", "docs/bench", "directory for the PNGs")
	flag.Parse()
	if err := run(*in, *out); err != nil {
		fmt.Fprintln(os.Stderr, "skipper-benchplot:", err)
		os.Exit(1)
	}
}

func run(in, out string) error {
	f, err := os.Open(in)
	if err != nil {
		return err
	}
	defer f.Close()
	rep, err := benchplot.Read(f)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	files, err := benchplot.Plot(rep, out)
	if err != nil {
		return err
	}
	for _, p := range files {
		fmt.Println(p)
	}
	return nil
}
