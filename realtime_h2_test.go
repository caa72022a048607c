package ratelimit

import (
	"bytes"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// A WebSocket session over HTTP/2 (an extended CONNECT, RFC 8441, which
// Caddy proxies as a session) has no connection for the session's tap and
// budget gate to read: under a chain that meters tokens or spend it is
// refused with 400, never let through uncounted; under one that does not,
// it is a session as any other. The gateway is a Caddy process of its own,
// serving HTTP/2 in clear, with Go's extended CONNECT on.
func TestAWebSocketOverHTTP2IsRefusedWhereItsTokensOrSpendWouldGoUncounted(t *testing.T) {
	t.Setenv("GODEBUG", "http2xconnect=1") // for the gateway process
	up := newUpstream(t)
	for lines, want := range map[string]string{
		"limit key * tpm 100000":                                 "400",
		"limit key * budget_day 5\n\t\tprice * input 1 output 2": "400",
		"limit key * rpm 100":                                    "200",
	} {
		gw := startCaddyProcessWith(t, caddyBinary(t), up.URL, "\tservers {\n\t\tprotocols h1 h2c\n\t}", limited("", "scope key {http.request.header.Authorization}\n"+lines))
		status, body := extendedConnect(t, strings.TrimPrefix(gw.url, "http://"), "/v1/realtime?model=gpt-4o-realtime-preview", "authorization", "Bearer sk-"+redistest.UniqueID(t))
		if status != want || want == "400" && !strings.Contains(body, "rate_limit_session_unmetered") {
			t.Errorf("%q: a WebSocket over HTTP/2 answered %s %s, want %s", lines, status, body, want)
		}
	}
}

// extendedConnect opens an HTTP/2 connection in clear to addr, asks with an
// extended CONNECT for a WebSocket on path with the headers given as name,
// value pairs, and returns the answer's status and the start of its body.
func extendedConnect(t *testing.T, addr, path string, headers ...string) (status, body string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, waitBound)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(waitBound)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(conn, conn)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	fields := append([]string{":method", "CONNECT", ":protocol", "websocket", ":scheme", "http", ":path", path, ":authority", addr, "sec-websocket-version", "13"}, headers...)
	for i := 0; i < len(fields); i += 2 {
		if err := enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]}); err != nil {
			t.Fatal(err)
		}
	}
	dec := hpack.NewDecoder(4096, nil)
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("reading the gateway's frames: %v (status %q)", err, status)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				continue
			}
			// RFC 8441 3: a client asks for an extended CONNECT only once the
			// server has said it takes them.
			if v, ok := f.Value(http2.SettingEnableConnectProtocol); !ok || v != 1 {
				t.Fatal("the gateway's SETTINGS do not enable extended CONNECT")
			}
			if err := fr.WriteSettingsAck(); err != nil {
				t.Fatal(err)
			}
			if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block.Bytes(), EndHeaders: true}); err != nil {
				t.Fatal(err)
			}
		case *http2.HeadersFrame:
			decoded, err := dec.DecodeFull(f.HeaderBlockFragment())
			if err != nil {
				t.Fatal(err)
			}
			for _, h := range decoded {
				if h.Name == ":status" {
					status = h.Value
				}
			}
			if status != "400" || f.StreamEnded() {
				return status, ""
			}
		case *http2.DataFrame:
			return status, string(f.Data())
		case *http2.RSTStreamFrame, *http2.GoAwayFrame:
			t.Fatalf("the gateway ended the stream: %v", f)
		}
	}
}
