package main

import (
	"bufio"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// benchmarks are the Go benchmarks' figures: by benchmark name, without
// its -GOMAXPROCS suffix, the value before each unit on its line.
type benchmarks map[string]map[string]float64

var procsSuffix = regexp.MustCompile(`-[0-9]+$`)

// readBenchmarks reads the benchmark lines of every .txt file in dir (a
// missing dir has none). A benchmark named twice keeps its first line.
func readBenchmarks(dir string) (benchmarks, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.txt"))
	if err != nil {
		return nil, err
	}
	b := benchmarks{}
	for _, path := range files {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			b.add(sc.Text())
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// add records a line "BenchmarkName-N  iterations  value unit  value unit ...".
func (b benchmarks) add(line string) {
	f := strings.Fields(line)
	if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
		return
	}
	name := procsSuffix.ReplaceAllString(f[0], "")
	if _, seen := b[name]; seen {
		return
	}
	units := map[string]float64{}
	for i := 3; i < len(f); i += 2 {
		if v, err := strconv.ParseFloat(f[i-1], 64); err == nil {
			units[f[i]] = v
		}
	}
	b[name] = units
}

// get is the figure of benchmark name in unit, NaN when it did not run.
func (b benchmarks) get(name, unit string) float64 {
	if v, ok := b[name][unit]; ok {
		return v
	}
	return math.NaN()
}
