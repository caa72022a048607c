package ratelimit

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// The ways around a limit that a hostile client (or one broken upstream)
// found, each shut in a real Caddy on both stores.

// A chat POST that carries WebSocket upgrade headers is no session: it is
// reserved, refused when too large, and its response metered; it takes no
// session slot.
func TestAPostWithUpgradeHeadersIsReservedRefusedWhenTooLargeAndMetered(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		gw := startGateway(t, up.URL, limited(store, `
			scope key {http.request.header.X-Api-Key}
			limit key * tpm 1000`))
		key := redistest.UniqueID(t)
		upgrade := []string{"X-Api-Key: " + key, "Upgrade: websocket", "Connection: Upgrade"}
		res, body := gw.postChat(t, `{"model":"m","max_tokens":1000000,"messages":[{"role":"user","content":"hi"}]}`, upgrade...)
		if res.StatusCode != 429 || !strings.Contains(string(body), "Request too large") {
			t.Fatalf("max_tokens 1000000 under tpm 1000 with upgrade headers: %d %s, want 429 too large", res.StatusCode, body)
		}
		res, body = gw.postChat(t, `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`, upgrade...)
		if res.StatusCode != 200 {
			t.Fatalf("a small request with upgrade headers: %d %s", res.StatusCode, body)
		}
		if n := openSessions.Load(); n != 0 {
			t.Fatalf("%d sessions open after a POST with upgrade headers", n)
		}
		// The upstream reported 7 tokens: they replace the reservation.
		waitCharged(t, store, []limiter.Limit{newLimit("key", limiter.KeyID(false, key), 0, 1000)}, 7)
	})
}

// postModel sends a JSON body naming a model to path with the given header
// lines ("Name: value"; a name given twice is sent twice).
func (g *gateway) postModel(t *testing.T, path string, headers ...string) (*http.Response, string) {
	t.Helper()
	res, body := g.send(t, "POST", path, `{"model":"m"}`, append([]string{"Content-Type: application/json"}, headers...)...)
	return res, string(body)
}

// A key header sent twice is refused with 400, naming the header and none of
// its values, before any counter is made: the upstream reads one of the
// values, so the limiter cannot count them joined. A joined scope reads a
// list header's values joined.
func TestARepeatedKeyHeaderIsRefusedWith400AndMakesNoCounter(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		gw := startGateway(t, up.URL, limited(store, `
			scope key {http.request.header.X-Api-Key}
			scope tags {http.request.header.X-Tags} readable joined
			limit key * rpm 1
			limit tags * rpm 5`))
		key, junk := redistest.UniqueID(t), redistest.UniqueID(t)
		if res, body := gw.postModel(t, "/v1/chat/completions", "X-Api-Key: "+key); res.StatusCode != 200 {
			t.Fatalf("first request: %d %s", res.StatusCode, body)
		}
		res, body := gw.postModel(t, "/v1/chat/completions", "X-Api-Key: "+key, "X-Api-Key: "+junk)
		if res.StatusCode != 400 || !strings.Contains(body, "X-Api-Key") || strings.Contains(body, key) || strings.Contains(body, junk) {
			t.Fatalf("a repeated key header: %d %s, want 400 naming the header and neither value", res.StatusCode, body)
		}
		for _, id := range []string{key + "," + junk, junk} {
			if n := windowHolds(t, store, newLimit("key", limiter.KeyID(false, id), 1, 0), limiter.RPM); n != 0 {
				t.Fatalf("a counter of %d requests for a variant of the key", n)
			}
		}
		if res, body := gw.postModel(t, "/v1/chat/completions", "X-Api-Key: "+junk, "X-Tags: a", "X-Tags: b"); res.StatusCode != 200 {
			t.Fatalf("a joined scope's repeated header: %d %s", res.StatusCode, body)
		}
		if n := windowHolds(t, store, newLimit("tags", "a-b", 5, 0), limiter.RPM); n != 0 {
			t.Fatal("a joined header counted as something else than its values joined")
		}
		if n := windowHolds(t, store, newLimit("tags", limiter.KeyID(true, "a,b"), 5, 0), limiter.RPM); n != 1 {
			t.Fatalf("the joined id counts %d requests, want 1", n)
		}
	})
}

// {http.rolter_ratelimit.api_key} is the credential the request's API reads,
// as its provider reads it: junk in another provider's header changes
// nothing, each provider's own header and query parameter count as one key
// (Bedrock's SigV4 its access key id, whatever it signs), and two
// credentials that differ are refused with 400.
func TestTheAPIKeyPlaceholderIsTheCredentialEachProviderReads(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		gw := startGateway(t, up.URL, limited(store, `
			scope key {http.rolter_ratelimit.api_key} required
			limit key * rpm 1`))
		openai, anthropic, gemini, azure := redistest.UniqueID(t), redistest.UniqueID(t), redistest.UniqueID(t), redistest.UniqueID(t)
		bedrock, bedrockAPIKey := redistest.UniqueID(t), redistest.UniqueID(t)
		const geminiPath = "/v1beta/models/gemini-2.5-flash:generateContent"
		for _, c := range []struct {
			name, path string
			headers    []string
			status     int
		}{
			{"OpenAI", "/v1/chat/completions", []string{"Authorization: Bearer " + openai}, 200},
			{"OpenAI with another provider's junk", "/v1/chat/completions", []string{"Authorization: Bearer " + openai, "X-Goog-Api-Key: " + redistest.UniqueID(t), "X-Api-Key: " + redistest.UniqueID(t)}, 429},
			{"Anthropic's x-api-key", "/v1/messages", []string{"X-Api-Key: " + anthropic, "X-Goog-Api-Key: " + redistest.UniqueID(t)}, 200},
			{"Anthropic's bearer token", "/v1/messages", []string{"Authorization: Bearer " + anthropic}, 429},
			{"Gemini's ?key=", geminiPath + "?key=" + gemini, nil, 200},
			{"Gemini's x-goog-api-key", geminiPath, []string{"X-Goog-Api-Key: " + gemini, "Authorization: Basic " + redistest.UniqueID(t)}, 429},
			{"Azure OpenAI's api-key", "/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21", []string{"Api-Key: " + azure}, 200},
			{"Azure OpenAI's bearer token", "/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21", []string{"Authorization: Bearer " + azure}, 429},
			{"Gemini's two keys that differ", geminiPath + "?key=" + redistest.UniqueID(t), []string{"X-Goog-Api-Key: " + redistest.UniqueID(t)}, 400},
			{"Anthropic's key sent twice", "/v1/messages", []string{"X-Api-Key: " + redistest.UniqueID(t), "X-Api-Key: " + redistest.UniqueID(t)}, 400},
			{"no credential the API reads", "/v1/chat/completions", []string{"X-Goog-Api-Key: " + redistest.UniqueID(t)}, 403},
			{"Bedrock's SigV4 access key id", bedrockConverse, []string{"Authorization: " + sigv4Authorization(bedrock)}, 200},
			{"Bedrock's access key id signing another request", bedrockConverse,
				[]string{"Authorization: " + strings.Replace(sigv4Authorization(bedrock), "Signature=fe5f", "Signature=0000", 1)}, 429},
			{"Bedrock's API key", bedrockConverse, []string{"Authorization: Bearer " + bedrockAPIKey}, 200},
			{"Bedrock's URL presigned by the same access key", bedrockConverse + "?X-Amz-Credential=" + bedrock + "%2F20261206%2Fus-east-1%2Fbedrock%2Faws4_request", nil, 429},
			{"Bedrock's two access keys", bedrockConverse + "?X-Amz-Credential=" + redistest.UniqueID(t) + "%2F20261206%2Fus-east-1%2Fbedrock%2Faws4_request",
				[]string{"Authorization: " + sigv4Authorization(redistest.UniqueID(t))}, 400},
			{"Cohere's bearer token, as OpenAI's", "/v2/chat", []string{"Authorization: Bearer " + openai}, 429},
		} {
			if res, body := gw.postModel(t, c.path, c.headers...); res.StatusCode != c.status {
				t.Errorf("%s: %d %s, want %d", c.name, res.StatusCode, body, c.status)
			}
		}
	})
}

// bedrockConverse is a Bedrock Converse path.
const bedrockConverse = "/model/us.anthropic.claude-sonnet-4-20250514-v1:0/converse"

// sigv4Authorization is the Authorization header of a request signed with
// AWS Signature Version 4 by the access key id.
func sigv4Authorization(accessKeyID string) string {
	return "AWS4-HMAC-SHA256 Credential=" + accessKeyID + "/20261206/us-east-1/bedrock/aws4_request, " +
		"SignedHeaders=content-type;host;x-amz-date, Signature=fe5f80f77d5fa3beca038a248ff027d0445342fe2855ddc963176630326f1024"
}

func TestCredentialIsReadFromTheSourcesOfTheRequestsAPI(t *testing.T) {
	for _, c := range []struct {
		path          string
		headers       http.Header
		want, refused string
	}{
		{"/v1/chat/completions", http.Header{"Authorization": {"Bearer sk-1"}, "Api-Key": {"x"}, "X-Api-Key": {"y"}}, "sk-1", ""},
		{"/v1/chat/completions", http.Header{"Authorization": {"bearer  sk-1 "}}, "sk-1", ""},
		{"/v1/chat/completions", http.Header{"Authorization": {"Basic abc"}}, "", ""},
		{"/v1/chat/completions", http.Header{"Authorization": {"Bearer a", "Bearer b"}}, "", "the header Authorization more than once"},
		{"/openai/deployments/d/chat/completions", http.Header{"Api-Key": {"az"}, "Authorization": {"Bearer az"}}, "az", ""},
		{"/openai/deployments/d/chat/completions", http.Header{"Api-Key": {"az"}, "Authorization": {"Bearer other"}}, "", "two credentials, in the header Api-Key and the header Authorization"},
		{"/v1/messages", http.Header{"X-Api-Key": {"ak"}, "Authorization": {"Bearer ak"}}, "ak", ""},
		{"/v1/projects/p/locations/l/publishers/anthropic/models/claude:rawPredict", http.Header{"Authorization": {"Bearer ya29"}, "X-Goog-Api-Key": {"g"}}, "ya29", ""},
		{"/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse&key=gk", http.Header{"X-Goog-Api-Key": {"gk"}}, "gk", ""},
		{"/v1beta/models/gemini-2.5-flash:generateContent?key=a&key=b", nil, "", "the query parameter key more than once"},
		{bedrockConverse, http.Header{"Authorization": {sigv4Authorization("AKIDEXAMPLE")}}, "AKIDEXAMPLE", ""},
		{bedrockConverse, http.Header{"Authorization": {"AWS4-ECDSA-P256-SHA256 Credential=AKIDV4A/20261206/bedrock/aws4_request, SignedHeaders=host, Signature=3045"}}, "AKIDV4A", ""},
		{bedrockConverse, http.Header{"Authorization": {"Bearer ABSKbedrockapikey"}}, "ABSKbedrockapikey", ""},
		{bedrockConverse + "?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIDPRESIGNED%2F20261206%2Fus-east-1%2Fbedrock%2Faws4_request&X-Amz-Signature=ab", nil, "AKIDPRESIGNED", ""},
		{bedrockConverse + "?X-Amz-Credential=AKIDOTHER%2F20261206%2Fus-east-1%2Fbedrock%2Faws4_request", http.Header{"Authorization": {sigv4Authorization("AKIDEXAMPLE")}}, "",
			"two credentials, in the header Authorization and the query parameter X-Amz-Credential"},
		{bedrockConverse, http.Header{"Authorization": {sigv4Authorization("AKIDA"), sigv4Authorization("AKIDB")}}, "", "the header Authorization more than once"},
		{bedrockConverse, http.Header{"Authorization": {"AWS4-HMAC-SHA256 SignedHeaders=host, Signature=ab"}, "X-Api-Key": {"k"}}, "", ""},
		{"/v2/chat", http.Header{"Authorization": {"Bearer co-key"}}, "co-key", ""},
	} {
		r := httptest.NewRequest("POST", c.path, nil)
		r.Header = c.headers
		got, refused := credential(requestOf(r))
		if got != c.want || refused != c.refused {
			t.Errorf("%s %v: credential %q, ambiguous %q; want %q, %q", c.path, c.headers, got, refused, c.want, c.refused)
		}
	}
}

// rawRequest sends head (a request line and headers, CRLF-terminated) on a
// new connection and returns the status line of the first answer, with the
// connection.
func rawRequest(t *testing.T, g *gateway, head string) (string, net.Conn) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(g.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	status, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(status), conn
}

// An id already refused by its requests per minute is refused before its
// body is read: its client, waiting on Expect: 100-continue, is answered 429
// and never asked for the body.
func TestAnIDAlreadyRefusedIsRefusedWithoutItsBodyBeingRead(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		gw := startGateway(t, up.URL, limited(store, `
			scope key {http.request.header.X-Api-Key}
			limit key * rpm 1 tpm 100000`))
		key := redistest.UniqueID(t)
		if res, body := gw.postChat(t, chatAbout1000, "X-Api-Key: "+key); res.StatusCode != 200 {
			t.Fatalf("first request: %d %s", res.StatusCode, body)
		}
		if res, body := gw.postChat(t, chatAbout1000, "X-Api-Key: "+key); res.StatusCode != 429 {
			t.Fatalf("second request: %d %s", res.StatusCode, body)
		}
		status, _ := rawRequest(t, gw, "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"+
			"X-Api-Key: "+key+"\r\nContent-Length: 4194300\r\nExpect: 100-continue\r\n\r\n")
		if !strings.HasPrefix(status, "HTTP/1.1 429") {
			t.Fatalf("a refused id's request waiting to send its body was answered %q, want 429 and no 100 Continue", status)
		}
	})
}

// Connections that send only headers claiming 4 MiB bodies, and hold them
// back, cost the gateway what their connections cost, and hold no body
// memory however many they are: a body holds memory once its bytes arrive.
// Meanwhile another client's request is admitted.
func TestHeaderOnlyConnectionsClaimingLargeBodiesHoldNoBodyMemory(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		gw := bodyMemoryGateway(t, store)
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)

		// 1000 is more than the 512 first buffers of 16 KiB that fill
		// body_memory 8MiB.
		const conns = 1000
		for range conns {
			startUpload(t, gw, "127.0.0.1", "", 0).askedForBody(t)
		}
		if held := bodiesHeld.bytesHeld(); held != 0 {
			t.Fatalf("bodies whose bytes have not come hold %d bytes", held)
		}
		if res, got := gw.postChat(t, chatAbout1000, "X-Api-Key: "+redistest.UniqueID(t)); res.StatusCode != http.StatusOK {
			t.Fatalf("a request while %d connections held back their bodies: %d %s", conns, res.StatusCode, got)
		}
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		grown := int64(after.HeapInuse) - int64(before.HeapInuse)
		t.Logf("the heap grew by %.1f MiB with %d connections sending headers only", float64(grown)/(1<<20), conns)
		// Each connection costs Caddy its buffers and its goroutine's
		// allocations, well below 64 KiB; a body allocated as claimed
		// would be 4 MiB.
		if limit := int64(conns * 64 << 10); grown > limit {
			t.Fatalf("the heap grew by %d MiB with %d connections sending headers only, over %d KiB each", grown>>20, conns, 64)
		}
	})
}

// One absurd usage report (1e20 tokens, an upstream's bug) charges at most
// the ceiling of one response (its output at most the request's own
// max_tokens), so that a pool every tenant shares is not locked for days:
// the next tenant is admitted, and the clamp is counted.
func TestAnAbsurdUsageReportChargesAtMostTheCeilingAndTheSharedPoolGoesOn(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		absurd := up.json(absurdCompletion)
		gw := startGateway(t, up.URL, limited(store, `
			scope key {http.request.header.X-Api-Key}
			scope model {http.rolter_ratelimit.model} readable
			limit model * tpm 20000000 itpm 20000000 otpm 20000000`))
		metric := `caddy_rolter_ratelimit_usage_clamped_total{what="response"}`
		clamped := scrape(t)[metric]
		const chat = `{"model":"gpt-4o","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`
		if res, body := gw.postChat(t, chat, "X-Api-Key: "+redistest.UniqueID(t), absurd); res.StatusCode != 200 {
			t.Fatalf("the absurd tenant's request: %d %s", res.StatusCode, body)
		}
		pool := []limiter.Limit{newLimit("model", "gpt-4o", 0, 1)}
		waitCharged(t, store, pool, maxResponseInput+10)
		waitWindow(t, store, pool, limiter.ITPM, maxResponseInput)
		waitWindow(t, store, pool, limiter.OTPM, 10)
		waitMetric(t, metric, clamped+1)
		if res, body := gw.postChat(t, chat, "X-Api-Key: "+redistest.UniqueID(t)); res.StatusCode != 200 {
			t.Fatalf("the next tenant of the shared pool: %d %s", res.StatusCode, body)
		}
	})
}
