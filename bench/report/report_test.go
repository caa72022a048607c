package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var nan = math.NaN()

func same(a, b float64) bool { return a == b || math.IsNaN(a) && math.IsNaN(b) }

func TestMedianIsTheMiddleOrTheMeanOfTheTwoMiddleMeasuredValues(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want float64
	}{
		{[]float64{3, 1, 2}, 2},
		{[]float64{4, 1, 3, 2}, 2.5},
		{[]float64{7}, 7},
		{[]float64{5, nan, 1}, 3}, // a round not measured is left out
		{nil, nan},
		{[]float64{nan}, nan},
	} {
		in := append([]float64(nil), tc.in...)
		if got := median(in); !same(got, tc.want) {
			t.Errorf("median(%v) = %v, want %v", tc.in, got, tc.want)
		}
		for i := range in {
			if !same(in[i], tc.in[i]) {
				t.Fatalf("median reordered its argument: %v, was %v", in, tc.in)
			}
		}
	}
}

func TestRatioIsTheMedianOfTheRoundsRatiosNotTheRatioOfTheMedians(t *testing.T) {
	// The machine slows down in round 2 and speeds up in round 3: each
	// round's ratio is of runs made next to each other.
	plain := []float64{100, 200, 400}
	limited := []float64{90, 300, 200}
	if got := median(perRound(limited, plain, ratio)); got != 0.9 {
		t.Fatalf("median of the rounds' ratios = %v, want 0.9", got)
	}
	if got := median(limited) / median(plain); got != 1 {
		t.Fatalf("the ratio of the medians = %v; the test wants it to differ from 0.9", got)
	}
	if got := perRound([]float64{5, 1, 9}, []float64{2, 0}, ratio); len(got) != 2 || got[0] != 2.5 || !math.IsNaN(got[1]) {
		t.Fatalf("perRound of 3 and 2 rounds, the second over 0 = %v, want [2.5 NaN]", got)
	}
	if got := median(perRound([]float64{1.5, 2, 4}, []float64{1, 1.5, 1}, diff)); got != 0.5 {
		t.Fatalf("median of the rounds' differences = %v, want 0.5", got)
	}
}

func TestPaceIsHalfThePlainMedianWithAConnectionPerPacedRequest(t *testing.T) {
	for _, tc := range []struct {
		plain           []float64
		paceMS, threads float64
		half, wantConns int
	}{
		{[]float64{7001, 7999, 9000}, 10, 2, 3999, 44}, // 3999 * 11 / 1000 = 43.989
		{[]float64{7001}, 10, 2, 3500, 39},             // 38.5 rounds up
		{[]float64{100}, 10, 2, 50, 2},                 // 0.55 -> 1, but a connection per thread
	} {
		m := measurements{"plain.rps": tc.plain, "pace_ms": {tc.paceMS}, "threads": {tc.threads}}
		p, err := m.pace()
		if err != nil || p.halfRate != tc.half || p.connections != tc.wantConns {
			t.Errorf("pace of plain %v, pace_ms %v, threads %v = %+v, %v; want half %d, %d connections",
				tc.plain, tc.paceMS, tc.threads, p, err, tc.half, tc.wantConns)
		}
	}
	if _, err := (measurements{"pace_ms": {10}, "threads": {2}}).pace(); err == nil {
		t.Error("pace without plain.rps succeeded")
	}
}

func TestCPUPerRequestIsTicksOverClockRateOverRequests(t *testing.T) {
	m := measurements{
		"clk_tck":             {100},
		"limited.caddy_ticks": {150, 80},
		"limited.requests":    {10000, 0},
	}
	got := m.cpuPerRequest("caddy", "limited")
	// 150 ticks = 1.5 s over 10000 requests = 150 µs; no requests: not measured.
	if len(got) != 2 || got[0] != 150 || !math.IsNaN(got[1]) {
		t.Fatalf("cpuPerRequest = %v, want [150 NaN]", got)
	}
}

func TestARatioIsJudgedAsTheTablePrintsIt(t *testing.T) {
	if got := rounded(0.8996); got != 0.9 {
		t.Fatalf("rounded(0.8996) = %v, want 0.9", got)
	}
	if got := check(rounded(0.8996), atLeast(0.90)); got != "yes" {
		t.Fatalf("a ratio printed 0.900 against >= 0.90: %s, want yes", got)
	}
	if got := check(rounded(0.8994), atLeast(0.90)); got != "NO" {
		t.Fatalf("a ratio printed 0.899 against >= 0.90: %s, want NO", got)
	}
	if got, want := check(nan, atMost(10)), "n/a"; got != want {
		t.Fatalf("check of a figure not measured = %s, want %s", got, want)
	}
	if got := num(nan, "%.2f us"); got != "n/a" {
		t.Fatalf("num of a figure not measured = %s, want n/a", got)
	}
}

func TestBenchmarkFiguresAreReadByNameWithoutTheProcsSuffix(t *testing.T) {
	b := benchmarks{}
	for _, line := range []string{
		"goos: linux",
		"BenchmarkAdmissionRedisServerTime/chain=4-2   \t   20000\t     61234 ns/op\t         7.31 redis-µs/admission",
		"BenchmarkAdmissionRedisServerTime/chain=4/concurrent=32-2 20000 9000 ns/op 8.12 admissions/call 6.95 redis-µs/admission",
		"BenchmarkAdmissionRedisServerTime/chain=4-2 20000 1 ns/op 99 redis-µs/admission", // a second line: the first counts
		"BenchmarkMemoryStoreAdmissions \t 1000000\t 812 ns/op\t 1231527 admissions/s",
		"BenchmarkBroken-2 --- FAIL",
	} {
		b.add(line)
	}
	for _, tc := range []struct {
		name, unit string
		want       float64
	}{
		{"BenchmarkAdmissionRedisServerTime/chain=4", "redis-µs/admission", 7.31},
		{"BenchmarkAdmissionRedisServerTime/chain=4", "ns/op", 61234},
		{"BenchmarkAdmissionRedisServerTime/chain=4/concurrent=32", "admissions/call", 8.12},
		{"BenchmarkAdmissionRedisServerTime/chain=4/concurrent=32", "redis-µs/admission", 6.95},
		{"BenchmarkMemoryStoreAdmissions", "admissions/s", 1231527},
		{"BenchmarkMemoryStoreAdmissions", "MB/s", nan},
		{"BenchmarkBroken", "ns/op", nan},
		{"BenchmarkMissing", "ns/op", nan},
	} {
		if got := b.get(tc.name, tc.unit); !same(got, tc.want) {
			t.Errorf("%s %s = %v, want %v", tc.name, tc.unit, got, tc.want)
		}
	}
}

// writeFiles writes name -> content into a new directory and returns it.
func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestResultsTablePrintsTheRowsOfBenchRun(t *testing.T) {
	measured := writeFiles(t, map[string]string{"measurements.txt": `
threads 2
connections 32
duration 5
rounds 2
pace_ms 10
clk_tck 100
cores 2
limited.requests 40000
limited.caddy_ticks 900
limited.redis_ticks 200
limited.upstream_ticks 100
limited.rps 8000
limited.admissions 40100
limited.evalsha_calls 4010
limited.evalsha_usec 300750
plain.requests 50000
plain.caddy_ticks 800
plain.redis_ticks 0
plain.upstream_ticks 100
plain.rps 10000
memory.requests 45000
memory.caddy_ticks 855
memory.redis_ticks 0
memory.rps 9000
memory-rpm.requests 50000
memory-rpm.caddy_ticks 840
memory-rpm.redis_ticks 0
memory-rpm.rps 9500
plain2.requests 50000
plain2.caddy_ticks 800
plain2.redis_ticks 0
plain2.upstream_ticks 100
plain2.rps 9900
refused.requests 60000
refused.caddy_ticks 700
refused.redis_ticks 1
refused.upstream_ticks 0
refused.rps 12000
refused.refusals 60010
refused.evalsha_calls 0
refused.requests 60000
refused.caddy_ticks 700
refused.redis_ticks 1
refused.upstream_ticks 0
refused.rps 11000
refused.refusals 55010
refused.evalsha_calls 55
plain2.requests 50000
plain2.caddy_ticks 800
plain2.redis_ticks 0
plain2.upstream_ticks 100
plain2.rps 10100
plain.requests 40000
plain.caddy_ticks 800
plain.redis_ticks 0
plain.upstream_ticks 80
plain.rps 8000
memory.requests 40000
memory.caddy_ticks 880
memory.redis_ticks 0
memory.rps 7000
memory-rpm.requests 40000
memory-rpm.caddy_ticks 820
memory-rpm.redis_ticks 0
memory-rpm.rps 7600
limited.requests 36000
limited.caddy_ticks 900
limited.redis_ticks 180
limited.upstream_ticks 72
limited.rps 7200
limited.admissions 0
limited.evalsha_calls 0
limited.evalsha_usec 0
plain.p99_ms 1.5
plain.p50_ms 0.5
plain.paced_rps 4400
limited.p99_ms 2.25
limited.p50_ms 0.75
limited.paced_rps 4300
limited.p99_ms 2.75
limited.p50_ms 0.8
limited.paced_rps 4200
plain.p99_ms 1.75
plain.p50_ms 0.6
plain.paced_rps 4500
`})
	goDir := writeFiles(t, map[string]string{
		"redis-time.txt": "BenchmarkAdmissionRedisServerTime/chain=4-2 20000 61234 ns/op 7.314 redis-µs/admission\n" +
			"BenchmarkAdmissionRedisServerTime/chain=4/reserving-2 20000 65000 ns/op 9.000 redis-µs/admission\n" +
			"BenchmarkAdmissionRedisServerTime/chain=4/budget-2 20000 70000 ns/op 10.500 redis-µs/admission\n" +
			"BenchmarkAdmissionRedisServerTime/chain=4/concurrent=32/reserving-2 20000 20000 ns/op 7.500 redis-µs/admission\n" +
			"BenchmarkAdmissionRedisServerTime/chain=4/concurrent=32/reserving/settled-2 20000 25000 ns/op 9.250 redis-µs/admission\n",
		"handler.txt": "BenchmarkHandler/none-2 100 150000 cpu-ns/op 90 allocs/op\n" +
			"BenchmarkHandler/memory-2 100 170500 cpu-ns/op 120 allocs/op\n",
		"build.txt": "",
	})
	out := results(t, filepath.Join(measured, "measurements.txt"), goDir)
	// Rows as bench/run prints them: the plain medians are 9000 (10000,
	// 8000) and the throughput ratio the median of 0.8 and 0.9; the second
	// limited round admitted nothing, so Redis time is the first round's.
	wantLines(t, out,
		"figure                                         |           ours |       baseline |  ratio/diff | target         | ok?",
		"-----------------------------------------------+----------------+----------------+-------------+----------------+-----",
		"throughput, 4-scope chain, all admitted        |     7600 req/s |     9000 req/s |       0.850 | >= 0.90        | NO",
		"  noise floor: plain2 vs plain (identical)     |    10000 req/s |     9000 req/s |       1.126 | (info)         | -",
		"p99 at half the plain max rate (~4500/s)       |        2.50 ms |        1.62 ms |    +0.88 ms | <= +1 ms       | yes",
		"  p50 at the same rate                         |        0.78 ms |        0.55 ms |    +0.23 ms | (info)         | -",
		"  CPU per request: caddy                       |       237.5 us |       180.0 us |    +57.5 us | (info)         | -",
		"Redis time per admission (HTTP, 4 scopes)      |        7.50 us |              - |           - | <= 10 us       | yes",
		"  evalsha calls per admission (admit+tokens)   |          0.100 |              - |           - | (info)         | -",
		"refusals served (one key over rpm 1)           |    11500 req/s |     9000 req/s |       1.278 | >= 1           | yes",
		"Redis calls per refused request                |          0.000 |              - |           - | <= 0.01        | yes",
		"Redis time per admission (Go bench, chain=4)   |        7.31 us |              - |           - | <= 10 us       | yes",
		"  the same, 32 concurrent (coalesced)          |            n/a |              - |           - | <= 10 us       | n/a",
		// A budget beside the same reservation without it.
		"  chain=4/budget (4 budgets, reserving)        |       10.50 us |        9.00 us |    +1.50 us | (info)         | -",
		// A reservation with its settlement, beside the reservation alone.
		"  chain=4/concurrent=32/reserving, settled     |        9.25 us |        7.50 us |    +1.75 us | <= 8 us        | NO",
		"usage meter, 10 MB OpenAI SSE (identity)       |            n/a |              - |           - | >= 1 GB/s      | n/a",
		"gateway CPU per request, in-process (Go)       |       170.5 us |       150.0 us |    +20.5 us | (info)         | -",
		"  allocations per request                      |            120 |             90 |           - | (info)         | -",
		"gateway CPU per request, Redis (Go)            |            n/a |       150.0 us |         n/a | (info)         | -",
		"4      |              7.31 us |                   61234 ns |                    n/a |             n/a",
		// Each site against the plain proxy of its round: plain costs Caddy
		// 160 and 200 us a request; memory 190 and 220 (+30, +20),
		// memory-rpm 168 and 205 (+8, +5); limited 225 and 250 (+65, +50)
		// and Redis 50 and 50, shares (65+50)/160 and (50+50)/200.
		"plain reverse_proxy (its own Caddy CPU)      |        9000 |         1 |     180.0 us |                 - |            - |              - | -                                | -",
		"  noise floor: plain2, the same again        |       10000 |     1.126 |     -20.0 us |     -40.0 .. +0.0 |            - |              - | (info)                           | -",
		"in process, 4 scopes, rpm only, headers off  |        8550 |     0.950 |      +6.5 us |      +5.0 .. +8.0 |       0.0 us |          0.038 | <= +10 us                        | yes",
		"in process, 4 scopes, rpm + tpm reserving    |        8000 |     0.887 |     +25.0 us |    +20.0 .. +30.0 |       0.0 us |          0.144 | <= +20 us                        | NO",
		"Redis, 4 scopes, rpm + tpm reserving         |        7600 |     0.850 |     +57.5 us |    +50.0 .. +65.0 |      50.0 us |          0.609 | share <= 0.30, vs plain >= 0.85  | NO",
		"1000     |                  n/a |             n/a",
		"- p99 and p50: wrk --latency, 50 connections each waiting 10 ms between requests; achieved 4450 req/s plain,",
		"  4250 limited (a slower answer slows the pacing a little); diff: the median of the rounds' differences",
		"- throughput: wrk -t2 -c32 -d5s, POST /v1/chat/completions, over 2 rounds; each round runs",
		"share the same 2 cores: figures are noisy;",
		"within ~4% on a quiet machine)",
	)
	// A run without paired rounds prints no table of them.
	if strings.Contains(out, "Sites paired") {
		t.Errorf("a table of paired sites without paired rounds:\n%s", out)
	}
}

// results is what report results prints of the measurements and the Go
// benchmarks' outputs in goDir.
func results(t *testing.T, measurements, goDir string) string {
	t.Helper()
	var out strings.Builder
	if err := run([]string{"results", measurements, goDir}, &out); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

// wantLines fails t for each of lines that out does not contain.
func wantLines(t *testing.T, out string, lines ...string) {
	t.Helper()
	for _, want := range lines {
		if !strings.Contains(out, want) {
			t.Errorf("no line %q in:\n%s", want, out)
		}
	}
}

func TestPairedSitesAreEachSetAgainstThePlainProxyLoadedBesideIt(t *testing.T) {
	// The least of the wrk rounds' figures that the report needs, and two
	// paired rounds: each site's CPU per request against that of the plain
	// proxy of its own pair, which differs from pair to pair as the machine
	// drifts.
	base := `
threads 2
connections 32
duration 5
rounds 1
pace_ms 10
clk_tck 100
cores 2
pinned 1
plain.requests 50000
plain.caddy_ticks 800
plain.rps 10000
`
	var pairs strings.Builder
	for _, round := range []struct {
		site                                  string
		requests, ticks, redis, plainRequests int
		plainTicks                            int
	}{
		// plain2 146 us beside 150 (-4), then 150 beside 148 (+2).
		{"plain2", 20000, 292, 0, 20000, 300},
		{"memory-rpm", 20000, 320, 0, 20000, 300}, // 160 beside 150: +10
		{"memory", 18000, 306, 0, 20000, 300},     // 170 beside 150: +20
		{"limited", 16000, 304, 48, 20000, 300},   // 190 beside 150: +40, Redis 30
		{"plain2", 20000, 300, 0, 20000, 296},
		{"memory-rpm", 20000, 312, 0, 20000, 296}, // 156 beside 148: +8
		{"memory", 19000, 304, 0, 20000, 296},     // 160 beside 148: +12
		{"limited", 17000, 306, 34, 20000, 296},   // 180 beside 148: +32, Redis 20
		{"mholt", 20000, 316, 0, 20000, 300},      // 158 beside 150: +8
		{"mholt", 20000, 306, 0, 20000, 296},      // 153 beside 148: +5
		// Every Caddy collecting at 1 GiB: memory-rpm +6 and +4, mholt +8
		// and +6.
		{"memory-rpm@gclimit", 20000, 312, 0, 20000, 300},
		{"memory-rpm@gclimit", 20000, 304, 0, 20000, 296},
		{"mholt@gclimit", 20000, 316, 0, 20000, 300},
		{"mholt@gclimit", 20000, 308, 0, 20000, 296},
	} {
		fmt.Fprintf(&pairs, "pair.%[1]s.requests %[2]d\npair.%[1]s.caddy_ticks %[3]d\npair.%[1]s.redis_ticks %[4]d\npair.%[1]s.rps %[2]d\n"+
			"pair.%[1]s.plain.requests %[5]d\npair.%[1]s.plain.caddy_ticks %[6]d\npair.%[1]s.plain.rps %[5]d\n",
			round.site, round.requests, round.ticks, round.redis, round.plainRequests, round.plainTicks)
	}
	// The Redis site's rounds: 10 us of evalsha per request at 4 requests a
	// call, then 9 us at 5.
	// Collections: memory-rpm's Caddy 60 and 40 in its 20000 requests,
	// mholt's 10 and 6, its plain proxy's 80 and 70.
	pairs.WriteString("pair.memory-rpm.collections 60\npair.memory-rpm.collections 40\npair.mholt.collections 10\npair.mholt.collections 6\n" +
		"pair.mholt.plain.collections 80\npair.mholt.plain.collections 70\n")
	pairs.WriteString("pair.limited.evalsha_calls 4000\npair.limited.evalsha_usec 160000\npair.limited.evalsha_calls 3400\npair.limited.evalsha_usec 153000\n")
	measured := writeFiles(t, map[string]string{"measurements.txt": base + pairs.String()})
	wantLines(t, results(t, filepath.Join(measured, "measurements.txt"), t.TempDir()),
		"Sites paired (each in a Caddy of its own, loaded at the same moment as a plain proxy in another",
		"plain reverse_proxy (its own Caddy CPU)      |       20000 |         1 |     149.0 us |                 - |",
		"  noise floor: plain2, the same again        |       20000 |     1.000 |      -1.0 us |      -4.0 .. +2.0 |            - |              - | (info)                           | -",
		"in process, 4 scopes, rpm only, headers off  |       20000 |     1.000 |      +9.0 us |     +8.0 .. +10.0 |       0.0 us |          0.060 | <= +10 us                        | yes",
		"in process, 4 scopes, rpm + tpm reserving    |       18500 |     0.925 |     +16.0 us |    +12.0 .. +20.0 |       0.0 us |          0.107 | <= +20 us                        | yes",
		// Shares (40+30)/150 and (32+20)/148; throughput 0.8 and 0.85.
		"Redis, 4 scopes, rpm + tpm reserving         |       16500 |     0.825 |     +36.0 us |    +32.0 .. +40.0 |      25.0 us |          0.409 | share <= 0.30, vs plain >= 0.85  | NO",
		"mholt/caddy-ratelimit, 4 zones               |       20000 |     1.000 |      +6.5 us |      +5.0 .. +8.0 |            - |              - | (info)                           | -",
		"Speed goals (paired rounds; redis-server pinned to a core of its own (PIN=1)):",
		// Redis 30 and 20 us; the Redis site's +40 and +32 less memory's +20
		// and +12; memory's; memory-rpm's +10 and +8 less mholt's +8 and +5.
		"redis-server CPU per request, Redis site                   |      25.0 us |    +20.0 .. +30.0 | <= 10 us               | NO",
		"  of which evalsha's own time (commandstats)               |       9.5 us |     +9.0 .. +10.0 | (info)                 | -",
		"  requests per evalsha call                                |          4.5 |      +4.0 .. +5.0 | (info)                 | -",
		"Redis client side: Redis site's Caddy CPU + less memory's  |     +20.0 us |    +20.0 .. +20.0 | <= +10 us              | NO",
		"in process, rpm + tpm reserving, OpenAI headers: Caddy +   |     +16.0 us |    +12.0 .. +20.0 | <= +20 us              | yes",
		"in process, rpm only, headers off: Caddy + less mholt's    |      +2.5 us |      +2.0 .. +3.0 | <= 0 (no dearer)       | NO",
		"  mholt/caddy-ratelimit, 4 zones: Caddy +                  |      +6.5 us |      +5.0 .. +8.0 | (info)                 | -",
		"  collections per 1000 requests, rpm-only site's Caddy     |         2.50 |      +2.0 .. +3.0 | (info)                 | -",
		"  collections per 1000 requests, mholt site's Caddy        |         0.40 |      +0.3 .. +0.5 | (info)                 | -",
		"  collections per 1000 requests, its plain proxy's         |         3.75 |      +3.5 .. +4.0 | (info)                 | -",
		"rpm only less mholt's, collections alike (GOGC=off)        |      -2.0 us |      -2.0 .. -2.0 | <= 0 (no dearer)       | yes",
		"  mholt/caddy-ratelimit, collections alike: Caddy +        |      +7.0 us |      +6.0 .. +8.0 | (info)                 | -",
	)
}
