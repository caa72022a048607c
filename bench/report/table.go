package main

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
)

// num is v printed with format, n/a when it was not measured.
func num(v float64, format string) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	return fmt.Sprintf(format, v)
}

// check is yes when v meets its target, NO when it does not, n/a when it
// was not measured.
func check(v float64, meets func(float64) bool) string {
	switch {
	case math.IsNaN(v):
		return "n/a"
	case meets(v):
		return "yes"
	}
	return "NO"
}

func atLeast(target float64) func(float64) bool { return func(v float64) bool { return v >= target } }
func atMost(target float64) func(float64) bool  { return func(v float64) bool { return v <= target } }

// table prints rows of cells " | "-separated, each as wide as its column's
// width (negative: left-aligned; a cell past the widths is not padded),
// and a rule under the header.
type table struct {
	w      io.Writer
	widths []int
	rule   string
}

func (t table) header(cells ...string) {
	t.row(cells...)
	fmt.Fprintln(t.w, t.rule)
}

func (t table) row(cells ...string) {
	for i, c := range cells {
		if i < len(t.widths) {
			cells[i] = fmt.Sprintf("%*s", t.widths[i], c)
		}
	}
	fmt.Fprintln(t.w, strings.Join(cells, " | "))
}

// median is the median of the rounds' values of name.
func (m measurements) median(name string) float64 { return median(m[name]) }

// pairedMedian is the median of the rounds' op of a and b.
func (m measurements) pairedMedian(a, b string, op func(x, y float64) float64) float64 {
	return median(perRound(m[a], m[b], op))
}

// writeResults prints the results table, the Redis cost by chain length and
// by active keys, and how each figure was measured.
func writeResults(w io.Writer, m measurements, b benchmarks) error {
	p, err := m.pace()
	if err != nil {
		return err
	}
	plainRPS := m.median("plain.rps")
	thrRatio := rounded(m.pairedMedian("limited.rps", "plain.rps", ratio))
	noiseRatio := rounded(m.pairedMedian("plain2.rps", "plain.rps", ratio))
	refusedRatio := rounded(ratio(m.median("refused.rps"), plainRPS))
	p99Diff := m.pairedMedian("limited.p99_ms", "plain.p99_ms", diff)
	p50Diff := m.pairedMedian("limited.p50_ms", "plain.p50_ms", diff)
	usecPerAdmission := median(perRound(m["limited.evalsha_usec"], m["limited.admissions"], ratio))
	callsPerAdmission := median(perRound(m["limited.evalsha_calls"], m["limited.admissions"], ratio))
	callsPerRefusal := median(perRound(m["refused.evalsha_calls"], m["refused.refusals"], ratio))
	reqs := func(v float64) string { return num(v, "%.0f req/s") }

	const chain = "BenchmarkAdmissionRedisServerTime/chain="
	const sse = "BenchmarkUsageMeterSSE10MB/openai/identity"
	chain4, chain4Concurrent := b.get(chain+"4", "redis-µs/admission"), b.get(chain+"4/concurrent=32", "redis-µs/admission")
	sseAllocs := b.get(sse, "allocs/op")
	memAdmissions := b.get("BenchmarkMemoryStoreAdmissions", "admissions/s")
	handlerNone := b.get("BenchmarkHandler/none", "cpu-ns/op") / 1000

	t := table{w: w, widths: []int{-46, 14, 14, 11, -14},
		rule: "-----------------------------------------------+----------------+----------------+-------------+----------------+-----"}
	t.header("figure", "ours", "baseline", "ratio/diff", "target", "ok?")
	t.row("throughput, 4-scope chain, all admitted", reqs(m.median("limited.rps")), reqs(plainRPS),
		num(thrRatio, "%.3f"), ">= 0.90", check(thrRatio, atLeast(0.90)))
	t.row("  noise floor: plain2 vs plain (identical)", reqs(m.median("plain2.rps")), reqs(plainRPS),
		num(noiseRatio, "%.3f"), "(info)", "-")
	t.row(fmt.Sprintf("p99 at half the plain max rate (~%d/s)", p.halfRate), num(m.median("limited.p99_ms"), "%.2f ms"),
		num(m.median("plain.p99_ms"), "%.2f ms"), num(p99Diff, "%+.2f ms"), "<= +1 ms", check(p99Diff, atMost(1)))
	t.row("  p50 at the same rate", num(m.median("limited.p50_ms"), "%.2f ms"), num(m.median("plain.p50_ms"), "%.2f ms"),
		num(p50Diff, "%+.2f ms"), "(info)", "-")
	for _, proc := range []string{"caddy", "redis", "upstream"} {
		ours, theirs := m.cpuPerRequest(proc, "limited"), m.cpuPerRequest(proc, "plain")
		t.row("  CPU per request: "+proc, num(median(ours), "%.1f us"), num(median(theirs), "%.1f us"),
			num(median(perRound(ours, theirs, diff)), "%+.1f us"), "(info)", "-")
	}
	t.row("Redis time per admission (HTTP, 4 scopes)", num(usecPerAdmission, "%.2f us"), "-", "-", "<= 10 us",
		check(usecPerAdmission, atMost(10)))
	t.row("  evalsha calls per admission (admit+tokens)", num(callsPerAdmission, "%.3f"), "-", "-", "(info)", "-")
	t.row("refusals served (one key over rpm 1)", reqs(m.median("refused.rps")), reqs(plainRPS),
		num(refusedRatio, "%.3f"), ">= 1", check(refusedRatio, atLeast(1)))
	t.row("Redis calls per refused request", num(callsPerRefusal, "%.3f"), "-", "-", "<= 0.01",
		check(callsPerRefusal, atMost(0.01)))
	t.row("Redis time per admission (Go bench, chain=4)", num(chain4, "%.2f us"), "-", "-", "<= 10 us", check(chain4, atMost(10)))
	t.row("  the same, 32 concurrent (coalesced)", num(chain4Concurrent, "%.2f us"), "-", "-", "<= 10 us",
		check(chain4Concurrent, atMost(10)))
	// Each variant beside the plain admission it adds to.
	for _, v := range []struct{ name, variant, what string }{
		{"4", "reserving", "1000 tokens each"},
		{"4/concurrent=32", "reserving", "1000 tokens each"},
		{"4", "in-flight-cap", "4 slots, freed"},
		{"4/concurrent=32", "in-flight-cap", "4 slots, freed"},
		{"4", "budget", "4 budgets, reserving"},
		{"4/concurrent=32", "budget", "4 budgets, reserving"},
	} {
		// A budget reserves: its baseline is the same reservation without it.
		base := chain + v.name
		if v.variant == "budget" {
			base += "/reserving"
		}
		with, without := b.get(chain+v.name+"/"+v.variant, "redis-µs/admission"), b.get(base, "redis-µs/admission")
		t.row("  chain="+v.name+"/"+v.variant+" ("+v.what+")", num(with, "%.2f us"), num(without, "%.2f us"),
			num(with-without, "%+.2f us"), "(info)", "-")
	}
	// The figure the gateway pays per admission that reserves: with its
	// settlement, which rides in a later call.
	settled, reserving := b.get(chain+"4/concurrent=32/reserving/settled", "redis-µs/admission"), b.get(chain+"4/concurrent=32/reserving", "redis-µs/admission")
	t.row("  chain=4/concurrent=32/reserving, settled", num(settled, "%.2f us"), num(reserving, "%.2f us"),
		num(settled-reserving, "%+.2f us"), "<= 8 us", check(settled, atMost(8)))
	sseGBs := b.get(sse, "MB/s") / 1000
	t.row("usage meter, 10 MB OpenAI SSE (identity)", num(sseGBs, "%.2f GB/s"), "-", "-", ">= 1 GB/s", check(sseGBs, atLeast(1)))
	t.row("  allocs per 10 MB stream (~37k events)", num(sseAllocs, "%.0f allocs"), "-", "-", "<= 100", check(sseAllocs, atMost(100)))
	t.row("in-process store admissions (-cpu 1)", num(memAdmissions, "%.0f /s"), "-", "-", ">= 1000000",
		check(memAdmissions, atLeast(1000000)))
	t.row("in-process store, 100k active keys", num(b.get("BenchmarkMemoryStore100kActiveKeys", "MiB/100k-keys"), "%.1f MiB"),
		"-", "-", "(info)", "-")
	// The handler's CPU time per request in the Go benchmark (32 clients,
	// 2 cores), over the same requests without the limiter.
	for _, h := range []struct{ label, bench string }{
		{"gateway CPU per request, in-process (Go)", "BenchmarkHandler/memory"},
		{"  the same, capping requests in flight", "BenchmarkHandler/memory/in-flight-cap"},
		{"  the same, with a budget on each limit", "BenchmarkHandler/memory/budget"},
		{"  the same, rpm alone, headers off", "BenchmarkHandler/memory/rpm-only"},
		{"gateway CPU per request, Redis (Go)", "BenchmarkHandler/redis"},
		{"  the same, capping requests in flight", "BenchmarkHandler/redis/in-flight-cap"},
		{"  the same, with a budget on each limit", "BenchmarkHandler/redis/budget"},
	} {
		us := b.get(h.bench, "cpu-ns/op") / 1000
		t.row(h.label, num(us, "%.1f us"), num(handlerNone, "%.1f us"), num(us-handlerNone, "%+.1f us"), "(info)", "-")
		t.row("  allocations per request", num(b.get(h.bench, "allocs/op"), "%.0f"),
			num(b.get("BenchmarkHandler/none", "allocs/op"), "%.0f"), "-", "(info)", "-")
	}

	// A store renews the slots it holds every third of slot_lease.
	for _, keys := range []string{"1000", "10000"} {
		name := "BenchmarkSlotRenewal/redis/keys=" + keys
		t.row("slot renewal, 10k in flight, "+keys+" keys: Redis", num(b.get(name, "redis-µs/renewal")/1000, "%.2f ms"), "-", "-", "(info)", "-")
		t.row("  the gateway's time (Redis; in-process)", num(b.get(name, "ns/op")/1e6, "%.2f ms"),
			num(b.get("BenchmarkSlotRenewal/memory/keys="+keys, "ns/op")/1e6, "%.2f ms"), "-", "(info)", "-")
	}

	// 1,000 requests of one key wait on a bucket of rate 1000 burst 1.
	t.row("waited request, 1,000 waiting: Redis calls", num(b.get("BenchmarkWaiting/redis", "redis-calls/op"), "%.2f"),
		"-", "-", "(info)", "-")
	t.row("  Redis time per waited request", num(b.get("BenchmarkWaiting/redis", "redis-µs/op"), "%.1f us"), "-", "-", "(info)", "-")
	t.row("  gateway CPU per waited request (Redis; in-process)", num(b.get("BenchmarkWaiting/redis", "cpu-ns/op")/1000, "%.1f us"),
		num(b.get("BenchmarkWaiting/memory", "cpu-ns/op")/1000, "%.1f us"), "-", "(info)", "-")

	writeSites(w, m, sitesInRounds)
	writeSites(w, m, sitesInPairs)
	writeSpeedGoals(w, m)

	fmt.Fprintln(w, "\nRedis time by chain length (Go benchmark, each limit with rpm and tpm, 20000 admissions):")
	t = table{w: w, widths: []int{-6, 20, 26, 22, 15},
		rule: "-------+----------------------+----------------------------+------------------------+----------------"}
	t.header("chain", "Redis us/admission", "client ns/op (sequential)", "32 concurrent: us/adm", "admissions/call")
	for _, c := range []string{"1", "2", "4", "6"} {
		t.row(c, num(b.get(chain+c, "redis-µs/admission"), "%.2f us"), num(b.get(chain+c, "ns/op"), "%.0f ns"),
			num(b.get(chain+c+"/concurrent=32", "redis-µs/admission"), "%.2f us"),
			num(b.get(chain+c+"/concurrent=32", "admissions/call"), "%.1f"))
	}

	fmt.Fprintln(w, "\nRedis time by active API keys (Go benchmark, 4-scope chains, 32 concurrent, every key's four counters in Redis):")
	t = table{w: w, widths: []int{-8, 20, 15}, rule: "---------+----------------------+----------------"}
	t.header("keys", "Redis us/admission", "admissions/call")
	for _, k := range []string{"1000", "100000"} {
		name := "BenchmarkAdmissionRedisServerTimeByActiveKeys/keys=" + k
		t.row(k, num(b.get(name, "redis-µs/admission"), "%.2f us"), num(b.get(name, "admissions/call"), "%.1f"))
	}

	_, err = fmt.Fprintf(w, `
How it was measured:
- throughput: wrk -t%[1]v -c%[2]v -d%[3]vs, POST /v1/chat/completions, over %[4]v rounds; each round runs
  limited and plain2 each right next to plain (the order reversed every other round); req/s columns: medians of the
  rounds; ratio: the median of the rounds' ratios (runs seconds apart, so that the machine's drift cancels)
- p99 and p50: wrk --latency, %[5]d connections each waiting %[6]v ms between requests; achieved %[7]s req/s plain,
  %[8]s limited (a slower answer slows the pacing a little); diff: the median of the rounds' differences
- CPU per request: user + system time of the process during a wrk round (/proc/<pid>/stat) / wrk's requests, medians;
  diff: the median of the rounds' differences
- Redis time: usec of cmdstat_evalsha (CONFIG RESETSTAT before each limited round) / admissions that round (Caddy's
  admissions_total); it includes the token charges, which ride in the calls of admit.lua (summed per key)
- refusals: every refused-site response is a 429 (its one admitted request was the sanity check); calls = evalsha calls / refusals
- Caddy, redis-server, the upstream and the load generator share the same %[9]v cores: figures are noisy;
  read a ratio against the noise floor row (two identical proxies; within ~4%% on a quiet machine)
`, m.setting("threads"), m.setting("connections"), m.setting("duration"), m.setting("rounds"),
		p.connections, m.setting("pace_ms"), num(m.median("plain.paced_rps"), "%.0f"), num(m.median("limited.paced_rps"), "%.0f"),
		m.setting("cores"))
	return err
}

// siteFigures says where a table of sites finds its figures: a site's, and
// those of the plain proxy it is set against, as prefixes of measurement
// names.
type siteFigures struct {
	title string
	site  func(name string) string
	plain func(name string) string
}

var (
	// The wrk rounds: every site in one Caddy, one after another, each
	// against the plain proxy of its round.
	sitesInRounds = siteFigures{
		title: "Sites side by side (wrk rounds, each against the plain proxy of its round; CPU added per request over the plain proxy's):",
		site:  func(name string) string { return name },
		plain: func(string) string { return "plain" },
	}
	// The paired rounds: each site in a Caddy of its own, loaded at the
	// same moment as a plain proxy in another.
	sitesInPairs = siteFigures{
		title: "Sites paired (each in a Caddy of its own, loaded at the same moment as a plain proxy in another; CPU added per request over that proxy's):",
		site:  func(name string) string { return "pair." + name },
		plain: func(name string) string { return "pair." + name + ".plain" },
	}
)

// writeSites prints the limited sites beside the plain proxy, each figure
// of a round against the plain proxy's of the same round: throughput, and
// the CPU each adds per request, Caddy's and Redis's, with the range of the
// rounds' differences and their targets. The Redis site's target is a
// share of what the plain proxy itself costs Caddy per request. Figures
// that were not measured at all (a run without paired rounds) print no
// table.
func writeSites(w io.Writer, m measurements, f siteFigures) {
	if len(m[f.site("plain2")+".requests"]) == 0 {
		return
	}
	fmt.Fprintln(w, "\n"+f.title)
	t := table{w: w, widths: []int{-44, 11, 9, 12, 17, 12, 14, -32},
		rule: "---------------------------------------------+-------------+-----------+--------------+-------------------+--------------+----------------+----------------------------------+-----"}
	t.header("site", "req/s", "vs plain", "Caddy CPU +", "rounds' range", "Redis CPU", "share of plain", "target", "ok?")
	plainCaddy := m.cpuPerRequest("caddy", f.plain("plain2"))
	t.row("plain reverse_proxy (its own Caddy CPU)", num(m.median(f.plain("plain2")+".rps"), "%.0f"), "1", num(median(plainCaddy), "%.1f us"),
		"-", "-", "-", "-", "-")
	for _, site := range []struct {
		name, label, target string
		meets               func(added, share, vsPlain float64) bool
	}{
		{"plain2", "  noise floor: plain2, the same again", "(info)", nil},
		{"memory-rpm", "in process, 4 scopes, rpm only, headers off", "<= +10 us", func(added, _, _ float64) bool { return added <= 10 }},
		{"memory", "in process, 4 scopes, rpm + tpm reserving", "<= +20 us", func(added, _, _ float64) bool { return added <= 20 }},
		{"limited", "Redis, 4 scopes, rpm + tpm reserving", "share <= 0.30, vs plain >= 0.85", func(_, share, vsPlain float64) bool {
			return share <= 0.30 && vsPlain >= 0.85
		}},
		{"mholt", "mholt/caddy-ratelimit, 4 zones", "(info)", nil},
	} {
		name, plain := f.site(site.name), f.plain(site.name)
		if site.name == "mholt" && len(m[name+".requests"]) == 0 {
			continue // built only from a source bench/run was given or found
		}
		plainCaddy := m.cpuPerRequest("caddy", plain)
		added := perRound(m.cpuPerRequest("caddy", name), plainCaddy, diff)
		redis := m.cpuPerRequest("redis", name)
		// What the site adds, Caddy's and Redis's, over what the plain
		// proxy costs Caddy, in each round.
		shares := perRound(perRound(added, redis, func(a, r float64) float64 { return a + r }), plainCaddy, ratio)
		vsPlain, share := rounded(m.pairedMedian(name+".rps", plain+".rps", ratio)), rounded(median(shares))
		ok := "-"
		if site.meets != nil {
			ok = "n/a"
			if a := median(added); !math.IsNaN(a + share + vsPlain) {
				ok = "NO"
				if site.meets(a, share, vsPlain) {
					ok = "yes"
				}
			}
		}
		redisCell, shareCell := num(median(redis), "%.1f us"), num(share, "%.3f")
		if site.meets == nil {
			redisCell, shareCell = "-", "-"
		}
		t.row(site.label, num(m.median(name+".rps"), "%.0f"), num(vsPlain, "%.3f"), num(median(added), "%+.1f us"),
			spread(added), redisCell, shareCell, site.target, ok)
	}
}

// writeSpeedGoals prints the four goals of issue 44 from the paired
// rounds, each the median of the rounds' own figures, with their range:
// redis-server's CPU per request of the Redis site; the Redis client's
// side, the Redis site's Caddy CPU over its plain proxy less the
// in-process token site's in the same round; the in-process token site
// over its plain proxy; and the in-process rpm-only site against
// mholt/caddy-ratelimit's four zones in the same round, with the garbage
// collections of each Caddy per 1000 requests, and again with every Caddy
// collecting only at 256 MiB (mholt's rings hold tens of MB, which space
// its collections further apart than any other process's). They are meant to
// be read with PIN=1, redis-server on a core of its own.
func writeSpeedGoals(w io.Writer, m measurements) {
	if len(m["pair.limited.requests"]) == 0 {
		return
	}
	pinned := "redis-server pinned to a core of its own (PIN=1)"
	if m.setting("pinned") != 1 {
		pinned = "NOT pinned: every process shares the cores (run with PIN=1 for these goals)"
	}
	fmt.Fprintf(w, "\nSpeed goals (paired rounds; %s):\n", pinned)
	t := table{w: w, widths: []int{-58, 12, 17, -22},
		rule: "-----------------------------------------------------------+--------------+-------------------+-----------------------+-----"}
	t.header("figure", "median", "rounds' range", "goal", "ok?")
	added := func(site string) []float64 {
		return perRound(m.cpuPerRequest("caddy", "pair."+site), m.cpuPerRequest("caddy", "pair."+site+".plain"), diff)
	}
	collections := func(process string) []float64 {
		return scaled(perRound(m["pair."+process+".collections"], m["pair."+process+".requests"], ratio), 1000)
	}
	for _, g := range []struct {
		label, goal, format string // format: "%+.1f us" unless set
		rounds              []float64
		meets               func(float64) bool
	}{
		{"redis-server CPU per request, Redis site", "<= 10 us", "%.1f us", m.cpuPerRequest("redis", "pair.limited"), atMost(10)},
		{"  of which evalsha's own time (commandstats)", "(info)", "%.1f us", perRound(m["pair.limited.evalsha_usec"], m["pair.limited.requests"], ratio), nil},
		{"  requests per evalsha call", "(info)", "%.1f", perRound(m["pair.limited.requests"], m["pair.limited.evalsha_calls"], ratio), nil},
		{"Redis client side: Redis site's Caddy CPU + less memory's", "<= +10 us", "", perRound(added("limited"), added("memory"), diff), atMost(10)},
		{"in process, rpm + tpm reserving, OpenAI headers: Caddy +", "<= +20 us", "", added("memory"), atMost(20)},
		{"in process, rpm only, headers off: Caddy + less mholt's", "<= 0 (no dearer)", "", perRound(added("memory-rpm"), added("mholt"), diff), atMost(0)},
		{"  mholt/caddy-ratelimit, 4 zones: Caddy +", "(info)", "", added("mholt"), nil},
		{"  collections per 1000 requests, rpm-only site's Caddy", "(info)", "%.2f", collections("memory-rpm"), nil},
		{"  collections per 1000 requests, mholt site's Caddy", "(info)", "%.2f", collections("mholt"), nil},
		{"  collections per 1000 requests, its plain proxy's", "(info)", "%.2f", collections("mholt.plain"), nil},
		{"rpm only less mholt's, collections alike (GOGC=off)", "<= 0 (no dearer)", "", perRound(added("memory-rpm@gclimit"), added("mholt@gclimit"), diff), atMost(0)},
		{"  mholt/caddy-ratelimit, collections alike: Caddy +", "(info)", "", added("mholt@gclimit"), nil},
	} {
		v, format := median(g.rounds), cmp.Or(g.format, "%+.1f us")
		ok := "-"
		if g.meets != nil {
			ok = check(v, g.meets)
		}
		t.row(g.label, num(v, format), spread(g.rounds), g.goal, ok)
	}
}

// spread is the range of the rounds' values, "n/a" when none was measured.
func spread(xs []float64) string {
	v := measured(xs)
	if len(v) == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%+.1f .. %+.1f", slices.Min(v), slices.Max(v))
}
