package main

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
)

// A figure that could not be measured (no rounds, a round without requests)
// is NaN: medians and pairs leave it out, and the table shows n/a.

// measurements are bench/run's figures by name, each in round order.
type measurements map[string][]float64

func readMeasurements(path string) (measurements, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	m := measurements{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 2 {
			return nil, fmt.Errorf("%s:%d: want \"name value\", got %q", path, n, sc.Text())
		}
		v, err := strconv.ParseFloat(fields[1], 64)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %v", path, n, err)
		}
		m[fields[0]] = append(m[fields[0]], v)
	}
	return m, sc.Err()
}

// setting is a value recorded once, NaN when it was not.
func (m measurements) setting(name string) float64 {
	if v := m[name]; len(v) > 0 {
		return v[0]
	}
	return math.NaN()
}

// median is the middle value, or the mean of the two middle ones, of the
// measured values in xs.
func median(xs []float64) float64 {
	v := measured(xs)
	if len(v) == 0 {
		return math.NaN()
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// measured is the values of xs that were measured, in order.
func measured(xs []float64) []float64 { return slices.DeleteFunc(slices.Clone(xs), math.IsNaN) }

// perRound is op of each round's a and b: the rounds' own ratios or
// differences, of runs made next to each other, so that the machine's
// drift over the run cancels. A round missing from either side is NaN.
func perRound(a, b []float64, op func(x, y float64) float64) []float64 {
	out := make([]float64, min(len(a), len(b)))
	for i := range out {
		out[i] = op(a[i], b[i])
	}
	return out
}

// ratio is x/y, NaN when y is 0 (a round with nothing to divide by).
func ratio(x, y float64) float64 {
	if y == 0 {
		return math.NaN()
	}
	return x / y
}

func diff(x, y float64) float64 { return x - y }

// scaled is each value times k.
func scaled(xs []float64, k float64) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = x * k
	}
	return out
}

// rounded is x as the table prints it with 3 decimals: a ratio is judged
// on what the table shows.
func rounded(x float64) float64 {
	v, _ := strconv.ParseFloat(strconv.FormatFloat(x, 'f', 3, 64), 64)
	return v
}

// pacing is the fixed rate of the latency rounds and wrk's connections for it.
type pacing struct {
	halfRate    int // half the plain proxy's median req/s
	connections int
}

// pace is the latency rounds' pacing. Each connection sends a request,
// waits for the answer, then pace_ms, so a connection's cycle is pace_ms
// plus its answer's time, taken as 1 ms; wrk needs a connection per thread
// at least.
func (m measurements) pace() (pacing, error) {
	plain := median(m["plain.rps"])
	paceMS, threads := m.setting("pace_ms"), m.setting("threads")
	if math.IsNaN(plain) || math.IsNaN(paceMS) || math.IsNaN(threads) {
		return pacing{}, fmt.Errorf("pace needs plain.rps, pace_ms and threads")
	}
	half := int(plain / 2)
	conns := max(int(float64(half)*(paceMS+1)/1000+0.5), int(threads))
	return pacing{halfRate: half, connections: conns}, nil
}

// cpuPerRequest is the CPU time in µs per request of proc in each round on
// site: its clock ticks over the round / the ticks per second / wrk's
// requests.
func (m measurements) cpuPerRequest(proc, site string) []float64 {
	us := scaled(m[site+"."+proc+"_ticks"], 1e6/m.setting("clk_tck"))
	return perRound(us, m[site+".requests"], ratio)
}
