// Command report is bench/run's arithmetic: from the figures bench/run
// recorded, one value per round, it takes the medians, the per-round ratios
// and differences of the runs made next to each other, and prints the
// results table.
//
//	report pace MEASUREMENTS           # prints "half_rate connections"
//	report results MEASUREMENTS GODIR  # prints the tables
//
// MEASUREMENTS holds lines "name value": a figure of a site once per round,
// in round order (limited.rps, limited.caddy_ticks, ...; see bench/run's
// record), and the run's settings once (threads, rounds, pace_ms, ...). GODIR holds
// the outputs of the Go benchmarks; a benchmark that is not there shows
// n/a.
package main

import (
	"fmt"
	"io"
	"os"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(1)
	}
}

func run(args []string, w io.Writer) error {
	switch {
	case len(args) == 2 && args[0] == "pace":
		m, err := readMeasurements(args[1])
		if err != nil {
			return err
		}
		p, err := m.pace()
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(w, p.halfRate, p.connections)
		return err
	case len(args) == 3 && args[0] == "results":
		m, err := readMeasurements(args[1])
		if err != nil {
			return err
		}
		b, err := readBenchmarks(args[2])
		if err != nil {
			return err
		}
		return writeResults(w, m, b)
	}
	return fmt.Errorf("usage: report pace MEASUREMENTS | report results MEASUREMENTS GODIR")
}
