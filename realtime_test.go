package ratelimit

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
	"github.com/rolter/caddy-ratelimit/internal/redistest"
	"github.com/rolter/caddy-ratelimit/internal/usage/usagetest"
)

func realtimeSite(store string, up *fakeUpstream, limits, realtime string) string {
	return fmt.Sprintf(`
	rolter_ratelimit /v1/realtime* {
		%s
		scope key {http.request.header.Authorization}
		scope org {http.request.header.X-Org}
		%s
		realtime {
			%s
		}
	}
	reverse_proxy {upstream} {
		stream_close_delay 1m
	}`, store, limits, realtime)
}

// mustDial opens a session that must be admitted.
func mustDial(t *testing.T, gw *gateway, id ids) *websocket.Conn {
	t.Helper()
	conn, status, body := dial(t, gw, id, false)
	if status != 101 {
		t.Fatalf("session: %d %s, want 101", status, body)
	}
	return conn
}

// dial opens a session of gpt-realtime; it returns the handshake's status
// when refused.
func dial(t *testing.T, gw *gateway, id ids, compress bool) (*websocket.Conn, int, string) {
	t.Helper()
	return dialPath(t, gw, "/v1/realtime?model=gpt-realtime", id, compress)
}

// dialPath opens a session at path (with its query).
func dialPath(t *testing.T, gw *gateway, path string, id ids, compress bool) (*websocket.Conn, int, string) {
	t.Helper()
	d := websocket.Dialer{EnableCompression: compress, HandshakeTimeout: 5 * time.Second}
	h := http.Header{}
	h.Set("Authorization", id.key)
	h.Set("X-Org", id.org)
	conn, res, err := d.Dial("ws"+strings.TrimPrefix(gw.url, "http")+path, h)
	if err != nil {
		if res == nil {
			t.Fatal(err)
		}
		var body strings.Builder
		buf := make([]byte, 4096)
		n, _ := res.Body.Read(buf)
		body.Write(buf[:n])
		return nil, res.StatusCode, body.String()
	}
	t.Cleanup(func() { conn.Close() })
	return conn, http.StatusSwitchingProtocols, ""
}

// respond asks the upstream for a response of n tokens and reads its event.
func respond(t *testing.T, conn *websocket.Conn, n int) {
	t.Helper()
	if err := conn.WriteMessage(websocket.TextMessage, createResponse("evt_"+strconv.Itoa(n), n)); err != nil {
		t.Fatal(err)
	}
	_, msg, err := conn.ReadMessage()
	if err != nil {
		t.Fatal(err)
	}
	var ev struct {
		Type     string `json:"type"`
		Response struct {
			Usage struct {
				TotalTokens int `json:"total_tokens"`
			} `json:"usage"`
		} `json:"response"`
	}
	if err := json.Unmarshal(msg, &ev); err != nil || ev.Type != "response.done" || ev.Response.Usage.TotalTokens != n {
		t.Fatalf("event %q: %v", msg, err)
	}
}

// closeAndWait closes the session and waits until the gateway has let go of
// it (its session slot is free again).
func closeAndWait(t *testing.T, conn *websocket.Conn) {
	t.Helper()
	conn.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""))
	conn.Close()
	waitOpenSessions(t, 0)
}

func waitOpenSessions(t *testing.T, want int64) {
	t.Helper()
	waitCount(t, "sessions open", openSessions.Load, want)
}

func realtimeIDs(t *testing.T) ids {
	return ids{key: "Bearer sk-" + redistest.UniqueID(t), org: redistest.UniqueID(t)}
}

func realtimeLimits(id ids) []limiter.Limit {
	return []limiter.Limit{newLimit("key", limiter.KeyID(false, id.key), 0, 1), newLimit("org", limiter.KeyID(false, id.org), 0, 1)}
}

func TestRealtimeSessionCostsOneRequestAndASecondOverRPMIsRefused(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newFakeUpstream(t, answerRealtime)
		gw := startGateway(t, up.URL, realtimeSite(store, up, "limit key * rpm 1 tpm 100000\n\t\tlimit org * rpm 100 tpm 100000", ""))
		id := realtimeIDs(t)
		conn := mustDial(t, gw, id)
		respond(t, conn, 10)
		if _, status, body := dial(t, gw, id, false); status != 429 || !strings.Contains(body, `"type":"requests"`) {
			t.Fatalf("second session over rpm 1: %d %s, want 429", status, body)
		}
		closeAndWait(t, conn)
	})
}

func TestRealtimeTokensAreChargedPerFlushWhileTheSessionLivesAndAtItsClose(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newFakeUpstream(t, answerRealtime)
		gw := startGateway(t, up.URL, realtimeSite(store, up, "limit key * rpm 100 tpm 100000\n\t\tlimit org * tpm 100000", "flush_interval 100ms"))
		id := realtimeIDs(t)
		conn := mustDial(t, gw, id)
		respond(t, conn, 100)
		waitCharged(t, store, realtimeLimits(id), 100) // charged by a flush: the session is still open
		respond(t, conn, 40)
		respond(t, conn, 2)
		if err := conn.WriteMessage(websocket.TextMessage, []byte(`{"type":"session.update"}`)); err != nil {
			t.Fatal(err)
		}
		closeAndWait(t, conn)
		waitCharged(t, store, realtimeLimits(id), 142)
	})
}

func TestRealtimeDeflateOfferIsRemovedSoTheSessionIsMetered(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newFakeUpstream(t, answerRealtime)
		gw := startGateway(t, up.URL, realtimeSite(store, up, "limit key * rpm 100 tpm 100000\n\t\tlimit org * tpm 100000", "flush_interval 1h"))
		id := realtimeIDs(t)
		conn, status, _ := dial(t, gw, id, true) // the client offers permessage-deflate
		if status != 101 {
			t.Fatalf("session: %d", status)
		}
		// The upgrade reached the upstream before its 101 came back.
		if offer := up.lastRequest(t).header.Get("Sec-WebSocket-Extensions"); strings.Contains(offer, "permessage-deflate") {
			t.Fatalf("the upstream was offered %q", offer)
		}
		respond(t, conn, 77)
		closeAndWait(t, conn)
		waitCharged(t, store, realtimeLimits(id), 77) // at the close: the flush interval never came
	})
}

func TestRealtimeMaxConnectionsRefusalTakesNoRPMSlot(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		waitOpenSessions(t, 0)
		up := newFakeUpstream(t, answerRealtime)
		gw := startGateway(t, up.URL, realtimeSite(store, up, "limit key * rpm 2", "max_connections 1"))
		id := realtimeIDs(t)
		first := mustDial(t, gw, id)
		_, status, body := dial(t, gw, id, false)
		if status != 503 || !strings.Contains(body, `"code":"connection_limit_exceeded"`) || !strings.Contains(body, `"type":"connections"`) {
			t.Fatalf("session over max_connections 1: %d %s, want 503", status, body)
		}
		closeAndWait(t, first)
		second, status, _ := dial(t, gw, id, false)
		if status != 101 {
			t.Fatalf("the second admitted session was refused (%d): the capped one took an rpm slot", status)
		}
		closeAndWait(t, second)
		if _, status, _ := dial(t, gw, id, false); status != 429 {
			t.Fatalf("third admitted session: %d, want 429 after rpm 2", status)
		}
	})
}

func TestRealtimeWhileTPMIsFullANewSessionIsRefusedAndAnOpenOneGoesOn(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newFakeUpstream(t, answerRealtime)
		gw := startGateway(t, up.URL, realtimeSite(store, up, "limit org * tpm 100", "flush_interval 50ms"))
		id := realtimeIDs(t)
		conn := mustDial(t, gw, id)
		respond(t, conn, 150)
		waitCharged(t, store, realtimeLimits(id)[1:], 150)
		if _, status, body := dial(t, gw, id, false); status != 429 || !strings.Contains(body, `"type":"tokens"`) {
			t.Fatalf("new session with tpm full: %d %s, want 429 tokens", status, body)
		}
		respond(t, conn, 5) // the open session goes on
		closeAndWait(t, conn)
		waitCharged(t, store, realtimeLimits(id)[1:], 155)
	})
}

func TestRealtimeSessionOutlivesAConfigReloadAndStillMeters(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newFakeUpstream(t, answerRealtime)
		site := realtimeSite(store, up, "limit key * rpm 100 tpm 100000\n\t\tlimit org * tpm 100000", "flush_interval 1h")
		gw := startGatewayWith(t, up.URL, "", site, 0)
		id := realtimeIDs(t)
		conn := mustDial(t, gw, id)
		respond(t, conn, 30)
		startGatewayWith(t, up.URL, "\tdebug", site, gw.port) // a reload; stream_close_delay keeps the session
		respond(t, conn, 12)
		closeAndWait(t, conn)
		waitCharged(t, store, realtimeLimits(id), 42)
	})
}

// An upstream that answers a handshake with anything but 101 sends a
// response, and it is metered as one: its usage is charged.
func TestAHandshakeAnsweredWithoutSwitchingProtocolsIsMeteredAsAResponse(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newFakeUpstream(t, answerUsage(200, 7)) // answers every request, a handshake too, with a chat completion of 7 tokens
		gw := startGateway(t, up.URL, limited(store, `
			scope key {http.request.header.X-Api-Key}
			limit key * tpm 1000`))
		key := redistest.UniqueID(t)
		res, body := gw.send(t, "GET", "/v1/realtime?model=gpt-realtime", "", "X-Api-Key: "+key, "Upgrade: websocket", "Connection: Upgrade",
			"Sec-WebSocket-Version: 13", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==")
		if res.StatusCode != 200 {
			t.Fatalf("handshake answered %d %s by the upstream, want its 200", res.StatusCode, body)
		}
		waitCharged(t, store, []limiter.Limit{newLimit("key", limiter.KeyID(false, key), 0, 1000)}, 7)
	})
}

// A session refused by max_connections is answered like every refusal: in
// the request's dialect, and through handle_errors with on_refusal error.
func TestASessionOverMaxConnectionsIsAnsweredInItsDialectAndHonoursOnRefusal(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		waitOpenSessions(t, 0)
		up := newFakeUpstream(t, answerRealtime)
		gw := startGateway(t, up.URL, realtimeSite(store, up, "limit key * rpm 10\n\t\tdialect anthropic", "max_connections 1"))
		id := realtimeIDs(t)
		first := mustDial(t, gw, id)
		if _, status, body := dial(t, gw, id, false); status != 503 || dialectOfAnswer([]byte(body)) != "anthropic" || !strings.Contains(body, `"overloaded_error"`) {
			t.Fatalf("session over max_connections 1 with dialect anthropic: %d %s, want Anthropic's 503", status, body)
		}
		closeAndWait(t, first)

		gw = startGateway(t, up.URL, realtimeSite(store, up, "limit key * rpm 10\n\t\ton_refusal error", "max_connections 1")+`
	handle_errors {
		respond "{http.rolter_ratelimit.outcome} {err.status_code}" {err.status_code}
	}`)
		first = mustDial(t, gw, id)
		if _, status, body := dial(t, gw, id, false); status != 503 || body != "refused_connections 503" {
			t.Fatalf("session over max_connections 1 with on_refusal error: %d %q, want handle_errors' answer", status, body)
		}
		closeAndWait(t, first)
	})
}

// A session under a budget is admitted while the budget is not spent, and
// charges each response's cost as it charges its tokens; once the budget is
// spent a new session is refused by it, and a session whose model has no
// price is refused before any store call.
func TestRealtimeSessionsChargeEachResponsesCostToTheirBudgets(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newFakeUpstream(t, answerRealtime)
		// A response of 100 tokens is 50 in and 50 out: $0.0002 + $0.0008.
		gw := startGateway(t, up.URL, realtimeSite(store, up, "price gpt-realtime input 4 output 16\n\t\tlimit org * budget_day 0.002",
			"flush_interval 100ms"))
		id := realtimeIDs(t)
		org, _ := limiter.CalendarOf("UTC")
		budgetLimit := limiter.NewLimit("", "org", limiter.KeyID(false, id.org), limiter.Caps{Budgets: limiter.BudgetCaps{Max: [limiter.NumBudgetPeriods]int64{limiter.BudgetDay: 2_000_000}, Calendar: org}})
		conn := mustDial(t, gw, id)
		respond(t, conn, 100)
		waitSpent(t, store, budgetLimit, limiter.BudgetDay, 1_000_000) // by a flush: the session is still open
		respond(t, conn, 100)
		closeAndWait(t, conn)
		waitSpent(t, store, budgetLimit, limiter.BudgetDay, 2_000_000)
		if _, status, body := dial(t, gw, id, false); status != 429 || !strings.Contains(body, `"insufficient_quota"`) {
			t.Fatalf("a session with the budget spent: %d %s, want 429 insufficient_quota", status, body)
		}
		other := realtimeIDs(t)
		d := websocket.Dialer{HandshakeTimeout: 5 * time.Second}
		_, res, err := d.Dial("ws"+strings.TrimPrefix(gw.url, "http")+"/v1/realtime?model=unpriced", http.Header{"Authorization": {other.key}, "X-Org": {other.org}})
		if err == nil || res == nil || res.StatusCode != http.StatusBadRequest {
			t.Fatalf("a session of a model without a price: %v %v, want 400", res, err)
		}
		res.Body.Close()
	})
}

// waitSpent waits until budget p of l holds want nano-dollars spent in
// store, and nothing reserved. Charges run in the background: poll for it.
func waitSpent(t *testing.T, store string, l limiter.Limit, p limiter.BudgetPeriod, want int64) {
	t.Helper()
	eventually(t, func() error {
		if c := peekInStore(t, store, l).Counts[0]; c.Spent[p] != want || c.Reserved[p] != 0 {
			return fmt.Errorf("scope %s: the %s budget holds %d spent and %d reserved, want %d and 0", l.Scope, p, c.Spent[p], c.Reserved[p], want)
		}
		return nil
	})
}

// modelSessionSite limits sessions by the model their URL names, a scope
// every session must have.
func modelSessionSite(store string, up *fakeUpstream) string {
	return fmt.Sprintf(`
	rolter_ratelimit {
		%s
		scope model {http.rolter_ratelimit.model} readable required
		limit model * rpm 1
	}
	reverse_proxy {upstream}`, store)
}

// A session's model is the one its URL names, OpenAI's model parameter or
// Azure's deployment: a required model scope admits it, and the limits of
// its model apply to it, as they do to a request whose body names it.
func TestARealtimeSessionIsLimitedByTheModelItsURLNames(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newFakeUpstream(t, answerRealtime)
		gw := startGateway(t, up.URL, modelSessionSite(store, up))
		model := "gpt-4o-" + redistest.UniqueID(t)
		for _, path := range []string{
			"/v1/realtime?model=" + model,
			"/openai/realtime?api-version=2024-10-01-preview&deployment=" + model + "-azure",
			"/openai/v1/realtime?model=" + model + "-azurev1",
		} {
			conn, status, body := dialPath(t, gw, path, realtimeIDs(t), false)
			if status != 101 {
				t.Fatalf("%s: the first session of its model: %d %s, want 101", path, status, body)
			}
			closeAndWait(t, conn)
			if _, status, body := dialPath(t, gw, path, realtimeIDs(t), false); status != 429 || !strings.Contains(body, `"type":"requests"`) || !strings.Contains(body, "model") {
				t.Fatalf("%s: a second session of the model over its rpm 1: %d %s, want 429 from the model's limit", path, status, body)
			}
		}
		if _, status, body := dialPath(t, gw, "/v1/realtime?intent=transcription", realtimeIDs(t), false); status != 403 {
			t.Fatalf("a session whose URL names no model, under a required model scope: %d %s, want 403", status, body)
		}
		// A handshake's body names no model the upstream reads.
		res, body := gw.send(t, "GET", "/v1/realtime", `{"model":"`+model+`-body"}`, "Upgrade: websocket", "Connection: Upgrade",
			"Sec-WebSocket-Version: 13", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Content-Type: application/json")
		if res.StatusCode != 403 {
			t.Fatalf("a handshake whose body names a model and its URL none: %d %s, want 403", res.StatusCode, body)
		}
	})
}

// A session URL that names its model more than once is refused with 400
// before any store call, as a repeated key header is: the upstream reads one
// of them, and the limiter must count the one it reads.
func TestARepeatedModelParameterOfASessionIsRefusedWith400AndMakesNoCounter(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newFakeUpstream(t, answerRealtime)
		gw := startGateway(t, up.URL, modelSessionSite(store, up))
		model := "gpt-4o-" + redistest.UniqueID(t)
		for _, query := range []string{
			"/v1/realtime?model=" + model + "&model=gpt-4o-other",
			"/v1/realtime?model=" + model + "&model=" + model,
			"/v1/realtime?model=" + model + ";model=gpt-4o-other",
			"/openai/realtime?deployment=" + model + "&deployment=gpt-4o-other",
			"/openai/realtime?deployment=" + model + "&model=gpt-4o-other",
		} {
			if _, status, body := dialPath(t, gw, query, realtimeIDs(t), false); status != 400 || !strings.Contains(body, `"code":"rate_limit_scope_ambiguous"`) {
				t.Fatalf("%s: %d %s, want 400 rate_limit_scope_ambiguous", query, status, body)
			}
		}
		for _, id := range []string{model, "gpt-4o-other"} {
			if d := peekInStore(t, store, limiter.NewLimit("", "model", id, limiter.CapsOfWindows(limiter.WindowCaps{limiter.RPM: 1}))); d.Counts[0].Window[limiter.RPM].Cur != 0 {
				t.Fatalf("the refused sessions counted %d requests against the model %s", d.Counts[0].Window[limiter.RPM].Cur, id)
			}
		}
	})
}

// A session under a budget is priced by the one model its URL names: a
// URL that names two cannot choose the cheaper.
func TestARealtimeSessionNamingTwoModelsIsNotPricedAtTheCheaper(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newFakeUpstream(t, answerRealtime)
		gw := startGateway(t, up.URL, realtimeSite(store, up, "price gpt-realtime input 4 output 16\n\t\tprice gpt-realtime-mini input 0.01 output 0.01\n\t\tlimit org * budget_day 1", ""))
		path := "/v1/realtime?model=gpt-realtime-mini&model=gpt-realtime"
		if _, status, body := dialPath(t, gw, path, realtimeIDs(t), false); status != 400 || !strings.Contains(body, `"code":"rate_limit_scope_ambiguous"`) {
			t.Fatalf("%s under a budget: %d %s, want 400 rate_limit_scope_ambiguous", path, status, body)
		}
	})
}

// realtimeErrorEvent is the Realtime API's error server event.
type realtimeErrorEvent struct {
	Type    string `json:"type"`
	EventID string `json:"event_id"`
	Error   struct {
		Type    string  `json:"type"`
		Code    string  `json:"code"`
		Message string  `json:"message"`
		Param   *string `json:"param"`
		EventID *string `json:"event_id"`
	} `json:"error"`
}

// mustBeRefused reads the next server event, which must be the error event
// that refuses the client event eventID ("": one that named none) with
// code.
func mustBeRefused(t *testing.T, conn *websocket.Conn, what, eventID, code string) realtimeErrorEvent {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, msg, err := conn.ReadMessage()
	if err != nil {
		t.Fatalf("%s: no event came back: %v", what, err)
	}
	var ev realtimeErrorEvent
	if err := json.Unmarshal(msg, &ev); err != nil || ev.Type != "error" || ev.Error.Code != code || !strings.HasPrefix(ev.EventID, "event_") ||
		(eventID == "") != (ev.Error.EventID == nil) || ev.Error.EventID != nil && *ev.Error.EventID != eventID {
		t.Fatalf("%s: the session got %s, want the error event refusing %q with %s", what, msg, eventID, code)
	}
	return ev
}

// mustEcho sends msg, which must reach the upstream (that echoes it).
func mustEcho(t *testing.T, conn *websocket.Conn, what string, msg []byte) {
	t.Helper()
	if err := conn.WriteMessage(websocket.TextMessage, msg); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, got, err := conn.ReadMessage(); err != nil || string(got) != string(msg) {
		t.Fatalf("%s: got %q (%v), want the upstream's echo of %q", what, got, err, msg)
	}
}

// spentSessionSite holds sessions to a day's budget of $0.001, which one
// response of 1000 tokens spends ten times over ($0.002 in, $0.008 out).
// The flush interval never comes: what the gate knows, it charged itself.
func spentSessionSite(store string, up *fakeUpstream) string {
	return realtimeSite(store, up, "price gpt-realtime input 4 output 16\n\t\tlimit org * budget_day 0.001", "flush_interval 1h")
}

// Once a session's budget is spent, its next response.create is answered
// with the Realtime API's own error event, insufficient_quota, and never
// reaches the upstream; so is its input audio, which server VAD answers on
// its own. The session goes on: every other event passes.
func TestARealtimeSessionWhoseBudgetIsSpentIsRefusedItsNextResponseInTheAPIsErrorEventAndGoesOn(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newFakeUpstream(t, answerRealtime)
		gw := startGateway(t, up.URL, spentSessionSite(store, up))
		id := realtimeIDs(t)
		conn := mustDial(t, gw, id)
		respond(t, conn, 1000)
		if err := conn.WriteMessage(websocket.TextMessage, createResponse("evt_next", 10)); err != nil {
			t.Fatal(err)
		}
		ev := mustBeRefused(t, conn, "response.create with the budget spent", "evt_next", "insufficient_quota")
		if ev.Error.Type != "insufficient_quota" || !strings.Contains(ev.Error.Message, "Budget reached for org: $0.001 per day") || strings.Contains(ev.Error.Message, id.org) {
			t.Fatalf("the error event %+v: want insufficient_quota naming the org's budget, never its id", ev.Error)
		}
		for _, audio := range []string{`{"type":"input_audio_buffer.append","event_id":"evt_audio","audio":"AAAA"}`, `{"type":"input_audio_buffer.commit","event_id":"evt_audio"}`} {
			if err := conn.WriteMessage(websocket.TextMessage, []byte(audio)); err != nil {
				t.Fatal(err)
			}
			mustBeRefused(t, conn, audio, "evt_audio", "insufficient_quota")
		}
		mustEcho(t, conn, "an event that asks for no response", []byte(`{"type":"conversation.item.create","event_id":"evt_item","item":{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}}`))
		if n := up.creates.Load(); n != 1 {
			t.Fatalf("the upstream got %d response.create events, want the 1 made before the budget was spent", n)
		}
		closeAndWait(t, conn)
		org, _ := limiter.CalendarOf("UTC")
		waitSpent(t, store, limiter.NewLimit("", "org", limiter.KeyID(false, id.org), limiter.Caps{Budgets: limiter.BudgetCaps{Max: [limiter.NumBudgetPeriods]int64{limiter.BudgetDay: 1_000_000}, Calendar: org}}), limiter.BudgetDay, 10_000_000)
	})
}

// clientFrame is a frame a client sends: masked.
func clientFrame(op byte, fin bool, rsv byte, payload []byte) []byte {
	return usagetest.Frame{Op: op, Fin: fin, RSV: rsv, Mask: []byte{0x5a, 0x0f, 0xf0, 0xa5}, Payload: payload}.Bytes()
}

// A client cannot slip a response.create past a spent budget: not
// fragmented around a ping, nor binary, nor compressed, nor spelled with
// escapes, repeated or differently cased keys, nor after other JSON, nor
// after more bytes than the gateway holds to read.
func TestASpentSessionRefusesEveryWayOfSpellingAResponseCreate(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newFakeUpstream(t, answerRealtime)
		gw := startGateway(t, up.URL, spentSessionSite(store, up))
		conn := mustDial(t, gw, realtimeIDs(t))
		respond(t, conn, 1000)
		create := createResponse("evt_frag", 10)
		big := fmt.Appendf(nil, `{"type":"conversation.item.create","pad":"%s","type":"response.create"}`, strings.Repeat("a", maxHeldEvent))
		for _, c := range []struct {
			what, eventID string
			frames        [][]byte
		}{
			{"fragmented around a ping", "evt_frag", [][]byte{
				clientFrame(usagetest.OpText, false, 0, create[:9]), clientFrame(usagetest.OpPing, true, 0, []byte("p")),
				clientFrame(usagetest.OpCont, false, 0, create[9:30]), clientFrame(usagetest.OpCont, true, 0, create[30:]),
			}},
			{"binary", "evt_bin", [][]byte{clientFrame(usagetest.OpBinary, true, 0, createResponse("evt_bin", 10))}},
			{"compressed", "", [][]byte{clientFrame(usagetest.OpText, true, 0x40, []byte{0x2a, 0xa9, 0x2c, 0x48, 0x55, 0xb2, 0x52})}},
			{"an escaped key", "evt_esc", [][]byte{clientFrame(usagetest.OpText, true, 0, []byte(`{"typ\u0065":"response.create","event_id":"evt_esc"}`))}},
			{"an escaped value", "evt_escv", [][]byte{clientFrame(usagetest.OpText, true, 0, []byte(`{"type":"response\u002ecreate","event_id":"evt_escv"}`))}},
			{"a repeated type", "evt_rep", [][]byte{clientFrame(usagetest.OpText, true, 0, []byte(`{"type":"session.update","event_id":"evt_rep","type":"response.create"}`))}},
			{"a type of another case after it", "evt_case", [][]byte{clientFrame(usagetest.OpText, true, 0, []byte(`{"type":"response.create","event_id":"evt_case","Type":"session.update"}`))}},
			{"after another JSON value", "", [][]byte{clientFrame(usagetest.OpText, true, 0, []byte(`{"type":"session.update"} {"type":"response.create"}`))}},
			{"not JSON", "", [][]byte{clientFrame(usagetest.OpText, true, 0, []byte(`{type: 'response.create'}`))}},
			{"past what the gateway holds", "", [][]byte{clientFrame(usagetest.OpText, false, 0, big[:100]), clientFrame(usagetest.OpCont, true, 0, big[100:])}},
		} {
			for _, f := range c.frames {
				if _, err := conn.UnderlyingConn().Write(f); err != nil {
					t.Fatal(err)
				}
			}
			mustBeRefused(t, conn, c.what, c.eventID, "insufficient_quota")
		}
		mustEcho(t, conn, "an event that asks for no response, after them", []byte(`{"type":"session.update","event_id":"evt_after"}`))
		if n := up.creates.Load(); n != 1 {
			t.Fatalf("the upstream got %d response.create events, want the 1 made before the budget was spent", n)
		}
		closeAndWait(t, conn)
	})
}

// A session under a budget whose store cannot be read is refused its next
// response, whatever on_redis_error says: a spend that cannot be counted is
// never let through. The session goes on.
func TestARealtimeSessionWhoseBudgetCannotBeReadIsRefusedItsNextResponse(t *testing.T) {
	srv := redistest.NewServer(t)
	up := newFakeUpstream(t, answerRealtime)
	gw := startGateway(t, up.URL, realtimeSite("redis "+srv.URL(), up, "price gpt-realtime input 4 output 16\n\t\tlimit org * budget_day 100", "flush_interval 1h"))
	conn := mustDial(t, gw, realtimeIDs(t))
	respond(t, conn, 1000)
	srv.Stop()
	if err := conn.WriteMessage(websocket.TextMessage, createResponse("evt_down", 10)); err != nil {
		t.Fatal(err)
	}
	mustBeRefused(t, conn, "response.create with the store down", "evt_down", "rate_limiter_unavailable")
	mustEcho(t, conn, "an event that asks for no response", []byte(`{"type":"session.update"}`))
	if n := up.creates.Load(); n != 1 {
		t.Fatalf("the upstream got %d response.create events, want 1", n)
	}
	closeAndWait(t, conn)
}
