package ratelimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
	"github.com/rolter/caddy-ratelimit/internal/redistest"
	"github.com/rolter/caddy-ratelimit/internal/usage/usagetest"
)

// orgTPM10500 caps a readable org scope at tpm 10500, the reservation tests'
// limit; orgTokens is that limit's counters for an org.
const orgTPM10500 = `
			scope org {http.request.header.X-Org} readable
			limit org * tpm 10500`

func orgTokens(org string) []limiter.Limit { return []limiter.Limit{newLimit("org", org, 0, 1)} }

// postChat sends a JSON chat completion.
func (g *gateway) postChat(t *testing.T, body string, headers ...string) (*http.Response, []byte) {
	t.Helper()
	return g.send(t, "POST", "/v1/chat/completions", body, append([]string{"Content-Type: application/json"}, headers...)...)
}

// chatAbout1000 is a chat completion that reserves exactly 1000 tokens: 400
// characters of input (100 tokens) and max_tokens 900.
var chatAbout1000 = `{"model":"gpt-4o","max_tokens":900,"messages":[{"role":"user","content":"` + strings.Repeat("abcd", 100) + `"}]}`

// sendAll sends n copies of body at once to the gateways at urls, which up
// holds, and returns their statuses, once every refused one has answered
// and the admitted ones have reached up: then it releases up and waits for
// the rest.
func sendAll(t *testing.T, urls []string, up *fakeUpstream, n int, body string, headers ...string) map[int]int {
	t.Helper()
	c := flightClient(t)
	headers = append(slices.Clone(headers), "X-Upstream: "+upstreamHeld)
	_, finish := heldBurstOf(t, urls, up, n, func(url string) flightAnswer { return postTo(c, url, "/v1/chat/completions", body, headers...) })
	return statuses(finish())
}

// Reservations hold a tpm under concurrency: 40 requests in flight at once,
// each reserving 1000 tokens against tpm 10500, admit exactly 10; after the
// responses the token windows hold exactly the usage they reported.
func TestConcurrentReservationsHoldTheTPMAndSettleToTheReportedUsage(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newFakeUpstream(t, answerUsage(200, 800))
		gw := startGateway(t, up.URL, limited(store, orgTPM10500))
		org := redistest.UniqueID(t)
		statuses := sendAll(t, []string{gw.url}, up, 40, chatAbout1000, "X-Org: "+org)
		if statuses[200] != 10 || statuses[429] != 30 {
			t.Fatalf("statuses %v, want exactly 10 admitted and 30 refused", statuses)
		}
		waitCharged(t, store, orgTokens(org), 10*800)
	})
}

// Three gateways sharing one Redis, each with its own client, admit together
// exactly what one would.
func TestThreeGatewaysSharingRedisReserveAsOne(t *testing.T) {
	url := redistest.EnvURL(t)
	up := newFakeUpstream(t, answerUsage(200, 1000))
	site := ""
	for i, path := range []string{"/a", "/b", "/c"} {
		// A timeout of its own gives each handler its own Redis client:
		// replicas that share counters only through Redis.
		site += fmt.Sprintf(`
	handle_path %s* {
		rolter_ratelimit {
			redis %s {
				timeout %dms
			}
			scope org {http.request.header.X-Org} readable
			limit org * tpm 10500
		}
		reverse_proxy {upstream}
	}`, path, url, 1000+i)
	}
	gw := startGateway(t, up.URL, site)
	org := redistest.UniqueID(t)
	statuses := sendAll(t, []string{gw.url + "/a", gw.url + "/b", gw.url + "/c"}, up, 40, chatAbout1000, "X-Org: "+org)
	if statuses[200] != 10 {
		t.Fatalf("statuses %v across three gateways, want exactly 10 admitted", statuses)
	}
	waitCharged(t, "redis "+url, orgTokens(org), 10*1000)
}

// Usage below the reservation gives the rest back: with 6000 of 10500 used,
// exactly 4 more requests of 1000 fit.
func TestUsageBelowTheReservationGivesTheRestBack(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		used := newFakeUpstream(t, answerUsage(200, 600))
		held := newFakeUpstream(t, answerUsage(200, 1000))
		limiter := limited(store, orgTPM10500)
		gw := startGateway(t, used.URL, fmt.Sprintf(`
	handle_path /used* {
	%s
	}
	handle_path /held* {
	%s
	}`, limiter, strings.ReplaceAll(limiter, "{upstream}", strings.TrimPrefix(held.URL, "http://"))))
		org := redistest.UniqueID(t)
		for i := range 10 {
			if res, body := gw.send(t, "POST", "/used/v1/chat/completions", chatAbout1000, "Content-Type: application/json", "X-Org: "+org); res.StatusCode != 200 {
				t.Fatalf("request %d: %d %s", i+1, res.StatusCode, body)
			}
		}
		waitCharged(t, store, orgTokens(org), 10*600)
		statuses := sendAll(t, []string{gw.url + "/held"}, held, 6, chatAbout1000, "X-Org: "+org)
		if statuses[200] != 4 {
			t.Fatalf("statuses %v of 6 requests of 1000 in flight with 6000 of 10500 used, want exactly 4 admitted", statuses)
		}
	})
}

// An upstream error reports no usage and costs the provider nothing: the
// whole reservation is given back.
func TestAnUpstreamErrorGivesTheReservationBack(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newFakeUpstream(t, answerUsage(500, 0))
		gw := startGateway(t, up.URL, limited(store, orgTPM10500))
		org := redistest.UniqueID(t)
		before := scrape(t)[`caddy_rolter_ratelimit_tokens_returned_total{kind="total",model=""}`]
		if res, _ := gw.postChat(t, chatAbout1000, "X-Org: "+org); res.StatusCode != 500 {
			t.Fatalf("status %d, want the upstream's 500", res.StatusCode)
		}
		waitCharged(t, store, orgTokens(org), 0)
		waitMetric(t, `caddy_rolter_ratelimit_tokens_returned_total{kind="total",model=""}`, before+1000)
	})
}

// A client that leaves before the response headers is charged its
// reservation: the provider has its prompt, and reverse_proxy's 499
// (client closed request) is no error of the upstream's.
func TestAClientThatLeavesBeforeTheResponseHeadersIsChargedItsReservation(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t) // holds the request (X-Upstream: held) until the gateway gives it up
		gw := startGateway(t, up.URL, limited(store, orgTPM10500))
		org := redistest.UniqueID(t)
		charged := scrape(t)[`caddy_rolter_ratelimit_tokens_charged_total{kind="total",model=""}`]
		ctx, cancel := context.WithCancel(context.Background())
		req, err := http.NewRequestWithContext(ctx, "POST", gw.url+"/v1/chat/completions", strings.NewReader(chatAbout1000))
		if err != nil {
			t.Fatal(err)
		}
		setHeaders(req, []string{"Content-Type: application/json", "X-Org: " + org, "X-Upstream: " + upstreamHeld})
		done := make(chan error, 1)
		go func() {
			res, err := gw.tester.Client.Do(req)
			if err == nil {
				res.Body.Close()
			}
			done <- err
		}()
		<-up.arrived
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("the client's request ended with %v, want it canceled", err)
		}
		<-up.abandoned
		waitMetric(t, `caddy_rolter_ratelimit_tokens_charged_total{kind="total",model=""}`, charged+1000)
		waitCharged(t, store, orgTokens(org), 1000)
	})
}

// An upstream that cannot be reached never had the prompt: the reservation
// is given back.
func TestAnUpstreamThatCannotBeReachedGivesTheReservationBack(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		nowhere := fmt.Sprintf("http://127.0.0.1:%d", freePort()) // nothing listens
		gw := startGateway(t, nowhere, limited(store, orgTPM10500))
		settlesAfterAFailure(t, store, gw, http.StatusBadGateway, "returned", 0)
	})
}

// An upstream that took the request but sent no headers in time (504) may
// have processed the prompt: the reservation stays charged.
func TestAnUpstreamThatTimesOutBeforeItsHeadersIsChargedTheReservation(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newFakeUpstream(t, answerUsage(200, 10))
		site := strings.Replace(limited(store, orgTPM10500), "reverse_proxy {upstream}",
			"reverse_proxy {upstream} {\n\t\ttransport http {\n\t\t\tresponse_header_timeout 100ms\n\t\t}\n\t}", 1)
		gw := startGateway(t, up.URL, site)
		settlesAfterAFailure(t, store, gw, http.StatusGatewayTimeout, "charged", 1000, "X-Upstream: "+upstreamHeld)
	})
}

// settlesAfterAFailure sends chatAbout1000 (1000 tokens reserved) through
// gw, which answers it with reverse_proxy's status, and waits until its
// settlement has counted the 1000 in tokens_<how>_total and the org's
// tpm holds tpm; headers go with the request.
func settlesAfterAFailure(t *testing.T, store string, gw *gateway, status int, how string, tpm int64, headers ...string) {
	t.Helper()
	org := redistest.UniqueID(t)
	metric := `caddy_rolter_ratelimit_tokens_` + how + `_total{kind="total",model=""}`
	before := scrape(t)[metric]
	if res, body := gw.postChat(t, chatAbout1000, append([]string{"X-Org: " + org}, headers...)...); res.StatusCode != status {
		t.Fatalf("%d %s, want reverse_proxy's %d", res.StatusCode, body, status)
	}
	waitMetric(t, metric, before+1000)
	waitCharged(t, store, orgTokens(org), tpm)
}

// A request whose reservation alone is over a tpm can never be admitted: it
// is refused at once, as OpenAI refuses a request too large, with
// x-should-retry false and no wait, and charges nothing.
func TestARequestTooLargeForItsTPMIsRefusedAtOnceAndNotToBeRetried(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newFakeUpstream(t, answerUsage(200, 10))
		gw := startGateway(t, up.URL, limited(store, `
			scope key {http.request.header.Authorization}
			scope org {http.request.header.X-Org} readable
			limit key * rpm 100
			limit org * tpm 10500`))
		org := redistest.UniqueID(t)
		body := `{"model":"gpt-4o","max_tokens":20000,"messages":[{"role":"user","content":"hi"}]}`
		res, got := gw.postChat(t, body, "X-Org: "+org, "Authorization: Bearer sk-"+org)
		var e openAIError
		if res.StatusCode != 429 || json.Unmarshal(got, &e) != nil || e.Error.Type != "tokens" ||
			!strings.Contains(e.Error.Message, "Request too large for org") || !strings.Contains(e.Error.Message, "Limit 10500, Requested 20001") {
			t.Fatalf("%d %s, want a 429 saying the request is too large", res.StatusCode, got)
		}
		if res.Header.Get("X-Should-Retry") != "false" || res.Header.Get("Retry-After") != "" || res.Header.Get("Retry-After-Ms") != "" {
			t.Fatalf("headers %v: want x-should-retry false and no wait", res.Header)
		}
		if up.hits.Load() != 0 {
			t.Fatal("the upstream saw the request")
		}
		if n := windowNow(t, store, newLimit("key", limiter.KeyID(false, "Bearer sk-"+org), 0, 0), limiter.RPM).Cur; n != 0 {
			t.Fatalf("the key was charged %d requests", n)
		}
		waitCharged(t, store, orgTokens(org), 0)
	})
}

// reserve_tokens off is the reactive behaviour: all 40 are admitted.
func TestReserveTokensOffAdmitsWhatTheWindowHasRoomForReactively(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newFakeUpstream(t, answerUsage(200, 1000))
		gw := startGateway(t, up.URL, limited(store, orgTPM10500+`
			reserve_tokens off`))
		org := redistest.UniqueID(t)
		if statuses := sendAll(t, []string{gw.url}, up, 40, chatAbout1000, "X-Org: "+org); statuses[200] != 40 {
			t.Fatalf("statuses %v, want all 40 admitted", statuses)
		}
		waitCharged(t, store, orgTokens(org), 40*1000)
	})
}

// The tokens headers of an admission count its reservation.
func TestAdmittedHeadersCountTheRequestsReservation(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newFakeUpstream(t, answerUsage(200, 1000))
		gw := startGateway(t, up.URL, limited(store, orgTPM10500+`
			headers openai ietf`))
		res, _ := gw.postChat(t, chatAbout1000, "X-Org: "+redistest.UniqueID(t))
		if got := res.Header.Get("X-Ratelimit-Remaining-Tokens"); got != "9500" {
			t.Errorf("x-ratelimit-remaining-tokens %q, want 10500 - 1000 reserved", got)
		}
		if got := res.Header.Get("Ratelimit"); !strings.HasPrefix(got, `"tokens";r=9500;`) {
			t.Errorf("RateLimit %q, want r=9500", got)
		}
	})
}

// waitMetric waits until the process's metric reads want: charges, and
// their metrics, land after the response.
func waitMetric(t *testing.T, name string, want float64) {
	t.Helper()
	eventually(t, func() error {
		if got := scrape(t)[name]; got != want {
			return fmt.Errorf("%s = %v, want %v", name, got, want)
		}
		return nil
	})
}

// Every response shape settles its reservation: each window then holds
// exactly what the response reported of its kind, in JSON, SSE or
// compressed form (tpm and tpd the total, itpm the input, which for
// Anthropic counts cache writes and not cache reads, otpm the output with
// its reasoning or thoughts); a successful answer that reports nothing keeps
// its reservation, and one that ends before its final report is charged at
// least it.
func TestEveryResponseShapeSettlesItsReservationToTheReportedUsage(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newFakeUpstream(t, answerSamples(t))
		gw := startGateway(t, up.URL, limited(store, `
			scope key {http.request.header.Authorization}
			scope team {http.request.header.X-Team}
			scope org {http.request.header.X-Org}
			limit key * rpm 1000 tpm 100000000
			limit team * tpm 100000000
			limit org * rpm 1000 tpm 100000000 itpm 100000000 otpm 100000000 tpd 1000000000`))
		for _, g := range usagetest.Goldens {
			for _, coding := range []string{"identity", "gzip"} {
				t.Run(g.File+"/"+coding, func(t *testing.T) {
					id := newIDs(t)
					if res, _ := gw.get(t, "/samples/"+g.File+"?coding="+coding, id.headers()...); res.StatusCode != 200 {
						t.Fatalf("status %d", res.StatusCode)
					}
					// A GET names no output cap, and has no body.
					reserved := limiter.TokenCounts{Total: defaultReserveOutput, Output: defaultReserveOutput}
					want := reserved
					if g.Metered {
						want = limiter.TokenCounts{Total: g.Tokens, Input: g.Input, Output: g.Output}
					}
					if usagetest.CutShort[g.File] {
						want = want.AtLeast(reserved)
					}
					waitCharged(t, store, id.limits(), want.Total)
					org := id.limits()[2:]
					waitWindow(t, store, org, limiter.ITPM, want.Input)
					waitWindow(t, store, org, limiter.OTPM, want.Output)
					waitWindow(t, store, org, limiter.TPD, want.Total)
				})
			}
		}
	})
}

// Each choice a request asks for (n, best_of, Gemini's candidateCount) is
// reserved its output, whether the request names an output cap or not:
// without one, the default output for each.
func TestEachChoiceARequestAsksForIsReservedItsOutput(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newFakeUpstream(t, answerUsage(200, 1000))
		gw := startGateway(t, up.URL, limited(store, `
			scope org {http.request.header.X-Org} readable
			limit org * tpm 100000
			headers openai`))
		prompt := strings.Repeat("abcd", 100) // 100 tokens
		chat := `"messages":[{"role":"user","content":"` + prompt + `"}]`
		for _, c := range []struct {
			what, path, body string
			reserved         int64
		}{
			{"chat n 8 without a cap", "/v1/chat/completions", `{"model":"gpt-4o","n":8,` + chat + `}`, 100 + 8*defaultReserveOutput},
			{"chat n 8 with max_tokens 50", "/v1/chat/completions", `{"model":"gpt-4o","n":8,"max_tokens":50,` + chat + `}`, 100 + 8*50},
			{"completions n 2 best_of 5 without a cap", "/v1/completions", `{"model":"gpt-3.5-turbo-instruct","n":2,"best_of":5,"prompt":"` + prompt + `"}`, 100 + 5*defaultReserveOutput},
			{"gemini candidateCount 3 without a cap", "/v1beta/models/gemini-2.5-flash:generateContent",
				`{"contents":[{"parts":[{"text":"` + prompt + `"}]}],"generationConfig":{"candidateCount":3}}`, 100 + 3*defaultReserveOutput},
		} {
			res, body := gw.send(t, "POST", c.path, c.body, "Content-Type: application/json", "X-Org: "+redistest.UniqueID(t))
			if res.StatusCode != 200 {
				t.Fatalf("%s: %d %s", c.what, res.StatusCode, body)
			}
			if got, want := res.Header.Get("X-Ratelimit-Remaining-Tokens"), strconv.FormatInt(100000-c.reserved, 10); got != want {
				t.Errorf("%s: x-ratelimit-remaining-tokens %s, want %s (100000 less %d reserved)", c.what, got, want, c.reserved)
			}
		}
	})
}
