// Command testsummary reads the events of `go test -json` on its input and
// prints what go test prints without -json: each package's ok, FAIL or "no
// test files" line, the output of each test that fails or does not finish,
// and build errors (with -v, every line, as go test -v). It ends with the
// skips and their reasons, the slowest tests, the tests and packages that
// failed, and the totals of tests run, passed, failed and skipped across
// all packages.
//
//	go test -json -race ./... | testsummary
//
// It exits 1 when a package or a test failed (or no event came), and, with
// -ci (the default when CI=true), when a test skipped for want of Redis:
// one whose reason names ROLTER_TEST_REDIS_URL. A Redis test fails rather
// than skips in CI already (redistest.EnvURL); this also holds a test that
// skips by hand. Other skips stay legitimate there: a folder of recorded
// responses that is not part of the repository, a kernel without a feature.
package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

func main() {
	ci, _ := strconv.ParseBool(os.Getenv("CI"))
	fs := flag.NewFlagSet("testsummary", flag.ExitOnError)
	verbose := fs.Bool("v", false, "print every line of output, as go test -v")
	slowest := fs.Int("slowest", 10, "list this many of the slowest tests")
	fs.BoolVar(&ci, "ci", ci, "fail when a test skipped for want of Redis (default: $CI)")
	_ = fs.Parse(os.Args[1:])
	os.Exit(summarise(os.Stdin, os.Stdout, options{verbose: *verbose, slowest: *slowest, ci: ci}))
}

type options struct {
	verbose bool
	slowest int
	ci      bool
}

// event is a line of go test -json (cmd/test2json's TestEvent, and the
// build events whose package is ImportPath).
type event struct {
	Action     string
	Package    string
	ImportPath string
	Test       string
	Elapsed    float64
	Output     string
}

// test is what a test said and how it ended ("" while it runs).
type test struct {
	pkg, name string
	output    []string
	result    string
	elapsed   time.Duration
}

// run is the state of the whole run.
type run struct {
	opts     options
	out      io.Writer
	tests    map[string]*test    // by package and name
	ended    []*test             // in the order they ended
	pkgLines map[string][]string // each package's own lines, not a test's
	pkgs     map[string]string   // each package's result
	running  map[string][]string // each package's tests that have not ended
}

func summarise(in io.Reader, out io.Writer, opts options) int {
	r := &run{opts: opts, out: out, tests: map[string]*test{}, pkgLines: map[string][]string{},
		pkgs: map[string]string{}, running: map[string][]string{}}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20) // a line of output may be long
	for sc.Scan() {
		var e event
		if line := sc.Bytes(); json.Unmarshal(line, &e) != nil || e.Action == "" {
			fmt.Fprintf(out, "%s\n", line) // not an event: as it came
			continue
		}
		r.add(e)
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintln(out, "testsummary:", err)
		return 1
	}
	return r.report()
}

func (r *run) add(e event) {
	if r.opts.verbose && e.Action == "output" {
		fmt.Fprint(r.out, e.Output)
	}
	switch {
	case e.Action == "build-output":
		// go test prints a build's errors as they come.
		if !r.opts.verbose {
			fmt.Fprint(r.out, e.Output)
		}
	case e.Test == "":
		r.addPackage(e)
	default:
		r.addTest(e)
	}
}

func (r *run) addPackage(e event) {
	switch e.Action {
	case "output":
		r.pkgLines[e.Package] = append(r.pkgLines[e.Package], e.Output)
	case "pass", "fail", "skip":
		r.pkgs[e.Package] = e.Action
		if r.opts.verbose {
			return
		}
		lines := r.pkgLines[e.Package]
		if e.Action == "fail" {
			// What a test that never ended said (a timeout's or a crash's
			// stack is told as its output), then the package's own lines.
			for _, name := range r.running[e.Package] {
				r.print(r.tests[e.Package+" "+name].output)
			}
			r.print(lines)
			return
		}
		if len(lines) > 0 { // its ok or "no test files" line
			fmt.Fprint(r.out, lines[len(lines)-1])
		}
	}
}

func (r *run) addTest(e event) {
	key := e.Package + " " + e.Test
	t := r.tests[key]
	if t == nil {
		t = &test{pkg: e.Package, name: e.Test}
		r.tests[key] = t
		r.running[e.Package] = append(r.running[e.Package], e.Test)
	}
	switch e.Action {
	case "output":
		t.output = append(t.output, e.Output)
	case "pass", "fail", "skip":
		t.result, t.elapsed = e.Action, time.Duration(e.Elapsed*float64(time.Second))
		r.ended = append(r.ended, t)
		r.running[e.Package] = slices.DeleteFunc(r.running[e.Package], func(n string) bool { return n == e.Test })
		if e.Action == "fail" && !r.opts.verbose {
			r.print(t.output)
		}
	}
}

// print writes lines, leaving out test2json's framing (=== RUN, PAUSE,
// CONT and NAME), which go test without -v does not print.
func (r *run) print(lines []string) {
	for _, l := range lines {
		if !strings.HasPrefix(l, "=== ") {
			fmt.Fprint(r.out, l)
		}
	}
}

// report prints the skips, the slowest tests and the totals, and returns
// the exit status.
func (r *run) report() int {
	counts := map[string]int{}
	skips := map[string][]*test{} // by reason
	for _, t := range r.ended {
		counts[t.result]++
		if t.result == "skip" {
			reason := skipReason(t.output)
			skips[reason] = append(skips[reason], t)
		}
	}
	top := 0
	for _, t := range r.tests {
		if isTopLevel(t) {
			top++
		}
	}
	unfinished := len(r.tests) - len(r.ended)
	failedPkgs := 0
	for _, res := range r.pkgs {
		if res == "fail" {
			failedPkgs++
		}
	}

	fmt.Fprintln(r.out)
	for _, reason := range slices.Sorted(maps.Keys(skips)) {
		ts := skips[reason]
		fmt.Fprintf(r.out, "skipped %d: %s\n", len(ts), reason)
		for i, t := range ts {
			if i == 5 {
				fmt.Fprintf(r.out, "\tand %d more\n", len(ts)-i)
				break
			}
			fmt.Fprintf(r.out, "\t%s %s\n", shortPackage(t.pkg), t.name)
		}
	}
	r.printSlowest()
	r.printFailures()
	fmt.Fprintf(r.out, "tests: %d run (%d top-level, %d subtests) in %d packages: %d passed, %d failed, %d skipped",
		len(r.tests), top, len(r.tests)-top, len(r.pkgs), counts["pass"], counts["fail"], counts["skip"])
	if unfinished > 0 {
		fmt.Fprintf(r.out, ", %d did not finish", unfinished)
	}
	fmt.Fprintln(r.out)

	status := 0
	if counts["fail"] > 0 || unfinished > 0 || failedPkgs > 0 {
		fmt.Fprintf(r.out, "FAIL: %d tests failed, %d did not finish, %d packages failed\n", counts["fail"], unfinished, failedPkgs)
		status = 1
	}
	if len(r.pkgs) == 0 {
		fmt.Fprintln(r.out, "FAIL: no go test -json event was read")
		status = 1
	}
	if r.opts.ci {
		for _, reason := range slices.Sorted(maps.Keys(skips)) {
			if strings.Contains(reason, redistest.URLEnv) {
				fmt.Fprintf(r.out, "FAIL: CI is set and %d tests skipped for want of Redis: %s\n", len(skips[reason]), reason)
				status = 1
			}
		}
	}
	return status
}

// printSlowest lists the top-level tests that took longest. Elapsed is a
// test's own: parallel tests overlap, so they add up to more than the run.
func (r *run) printSlowest() {
	var top []*test
	for _, t := range r.ended {
		if isTopLevel(t) {
			top = append(top, t)
		}
	}
	slices.SortStableFunc(top, func(a, b *test) int { return cmp.Compare(b.elapsed, a.elapsed) })
	top = top[:min(r.opts.slowest, len(top))]
	if len(top) == 0 {
		return
	}
	fmt.Fprintf(r.out, "slowest %d tests (parallel ones overlap):\n", len(top))
	for _, t := range top {
		fmt.Fprintf(r.out, "\t%7.2fs  %s %s\n", t.elapsed.Seconds(), shortPackage(t.pkg), t.name)
	}
}

// printFailures lists the tests that failed, in the order they ended, those
// that never ended, and the packages that failed: the places to look in
// the output above.
func (r *run) printFailures() {
	var failed []string
	for _, t := range r.ended {
		if t.result == "fail" {
			failed = append(failed, shortPackage(t.pkg)+" "+t.name)
		}
	}
	var unfinished, pkgs []string
	for _, pkg := range slices.Sorted(maps.Keys(r.running)) {
		for _, name := range r.running[pkg] {
			unfinished = append(unfinished, shortPackage(pkg)+" "+name)
		}
	}
	for _, pkg := range slices.Sorted(maps.Keys(r.pkgs)) {
		if r.pkgs[pkg] == "fail" {
			pkgs = append(pkgs, shortPackage(pkg))
		}
	}
	for _, list := range []struct {
		title string
		items []string
	}{{"failed", failed}, {"did not finish", unfinished}, {"packages that failed", pkgs}} {
		if len(list.items) > 0 {
			fmt.Fprintf(r.out, "%s:\n\t%s\n", list.title, strings.Join(list.items, "\n\t"))
		}
	}
}

// isTopLevel reports whether t is a test function, not a subtest.
func isTopLevel(t *test) bool { return !strings.Contains(t.name, "/") }

// skipReason is what a skipped test said, without test2json's framing and
// the file:line before each message.
func skipReason(output []string) string {
	var said []string
	for _, l := range output {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "=== ") || strings.HasPrefix(l, "--- ") {
			continue
		}
		if file, msg, ok := strings.Cut(l, ": "); ok && strings.Contains(file, ".go:") && !strings.Contains(file, " ") {
			l = msg
		}
		said = append(said, l)
	}
	if len(said) == 0 {
		return "(no reason given)"
	}
	return strings.Join(said, " / ")
}

// shortPackage is pkg without the module's path.
func shortPackage(pkg string) string {
	const module = "github.com/rolter/caddy-ratelimit"
	if rest, ok := strings.CutPrefix(pkg, module+"/"); ok {
		return rest
	}
	if pkg == module {
		return "."
	}
	return pkg
}
