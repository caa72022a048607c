package ratelimit

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/rolter/caddy-ratelimit/internal/tokenest"
	"github.com/rolter/caddy-ratelimit/internal/usage"
	"github.com/rolter/caddy-ratelimit/internal/usage/usagetest"
)

// readClientEvents reads stream, byte by byte, through clientEvents that
// refuse the messages refuse says, and returns what they passed on, the
// messages judged (whole or not) and the error that ended the read.
func readClientEvents(stream []byte, refuse func(msg string) bool) (passed []byte, judged []string, err error) {
	c := newClientEvents(iotest.OneByteReader(bytes.NewReader(stream)), func(msg []byte, whole bool) bool {
		s := string(msg)
		if !whole {
			s = "partial:" + s
		}
		judged = append(judged, s)
		return !refuse(s)
	})
	passed, err = io.ReadAll(c)
	return passed, judged, err
}

// Each data message is held until it is whole, then passed on byte for
// byte as the client sent it, or dropped whole; control frames go on at
// once, ahead of the fragments held around them.
func TestClientEventsPassEachMessageWholeOrDropItAndLetControlFramesThrough(t *testing.T) {
	first, second := []byte(`{"type":"session.update"}`), []byte(`{"type":"response.create"}`)
	frag1 := clientFrame(usagetest.OpText, false, 0, first[:10])
	ping := clientFrame(usagetest.OpPing, true, 0, []byte("p"))
	frag2 := clientFrame(usagetest.OpCont, true, 0, first[10:])
	whole := clientFrame(usagetest.OpText, true, 0, second)
	binary := clientFrame(usagetest.OpBinary, true, 0, second)
	closing := clientFrame(usagetest.OpClose, true, 0, []byte{0x03, 0xe8})
	stream := usagetest.Stream(frag1, ping, frag2, whole, binary, closing)

	passed, judged, err := readClientEvents(stream, func(string) bool { return false })
	if want := usagetest.Stream(ping, frag1, frag2, whole, binary, closing); err != nil || !bytes.Equal(passed, want) {
		t.Fatalf("passed %q (%v), want every frame as sent, the ping ahead of the message around it", passed, err)
	}
	if want := []string{string(first), string(second), string(second)}; strings.Join(judged, "|") != strings.Join(want, "|") {
		t.Fatalf("judged %q, want each message unmasked, whole", judged)
	}
	passed, _, _ = readClientEvents(stream, func(msg string) bool { return strings.Contains(msg, "response.create") })
	if want := usagetest.Stream(ping, frag1, frag2, closing); !bytes.Equal(passed, want) {
		t.Fatalf("passed %q, want the refused messages dropped whole and the rest as sent", passed)
	}
}

// A message longer than the gateway holds is judged unread, on what was
// held of it, before its first bytes go on; passed, the rest streams on,
// refused, the rest is dropped.
func TestClientEventsJudgeAMessageTooLongToHoldBeforeAnyOfItGoesOn(t *testing.T) {
	long := bytes.Repeat([]byte("a"), maxHeldEvent+10)
	frames := [][]byte{clientFrame(usagetest.OpText, false, 0, long[:100]), clientFrame(usagetest.OpCont, true, 0, long[100:])}
	after := clientFrame(usagetest.OpText, true, 0, []byte(`{}`))
	stream := usagetest.Stream(frames[0], frames[1], after)
	passed, judged, err := readClientEvents(stream, func(string) bool { return false })
	if err != nil || !bytes.Equal(passed, stream) {
		t.Fatalf("passed %d bytes (%v), want the %d of the stream as sent", len(passed), err, len(stream))
	}
	if len(judged) != 2 || judged[0] != "partial:"+string(long[:100]) || judged[1] != "{}" {
		t.Fatalf("judged %.40q, want the long message on its first 100 bytes, unread, then the next whole", judged)
	}
	passed, _, _ = readClientEvents(stream, func(msg string) bool { return strings.HasPrefix(msg, "partial:") })
	if !bytes.Equal(passed, after) {
		t.Fatalf("passed %d bytes, want only the message after the refused one", len(passed))
	}
}

// What no WebSocket frame can be ends the read, after the frames before it.
func TestClientEventsEndAtCorruptFraming(t *testing.T) {
	ok := clientFrame(usagetest.OpText, true, 0, []byte(`{}`))
	for _, corrupt := range [][]byte{
		{0x83, 0x80, 0, 0, 0, 0},                            // a reserved opcode
		clientFrame(usagetest.OpCont, true, 0, []byte("x")), // a continuation of nothing
		{0xa1, 0x80, 0, 0, 0, 0},                            // RSV2
		clientFrame(usagetest.OpPing, false, 0, nil),        // a fragmented control frame
	} {
		passed, _, err := readClientEvents(usagetest.Stream(ok, corrupt, ok), func(string) bool { return false })
		if !errors.Is(err, errClientFraming) || !bytes.Equal(passed, ok) {
			t.Fatalf("% x: passed %q, %v; want the frame before it, then errClientFraming", corrupt, passed, err)
		}
	}
}

// The gate's message to the client waits for the upstream's stream to be
// between two messages, and is never written after its close frame.
func TestAnInjectedMessageWaitsForTheUpstreamsMessageToEnd(t *testing.T) {
	done := []byte(usagetest.Done(4, 0))
	frag1 := usagetest.Frame{Op: usagetest.OpText, Payload: done[:20]}.Bytes()
	frag2 := usagetest.Frame{Op: usagetest.OpCont, Fin: true, Payload: done[20:]}.Bytes()
	refusal := errorEvent(answer{typ: "insufficient_quota", code: "insufficient_quota", message: "spent"}, "evt")
	sc := &shortConn{}
	tap := usage.NewRealtimeTap(usage.MaxEvent, usageCeiling(tokenest.Estimate{}))
	conn := &tappedConn{Conn: sc, tap: tap}
	conn.Write(frag1[:3])
	conn.inject(refusal)
	conn.Write(frag1[3:])
	if !bytes.Equal(sc.out.Bytes(), frag1) {
		t.Fatal("the message was written inside the upstream's fragmented message")
	}
	conn.Write(frag2)
	if want := usagetest.Stream(frag1, frag2, refusal); !bytes.Equal(sc.out.Bytes(), want) {
		t.Fatalf("wrote %q, want the upstream's message, then the gate's", sc.out.Bytes())
	}
	usagetest.CheckTap(t, tap, doneUsage(4, 1), 0)
	closing := []byte{0x88, 0x02, 0x03, 0xe9}
	conn.Write(closing)
	conn.inject(refusal)
	if want := usagetest.Stream(frag1, frag2, refusal, closing); !bytes.Equal(sc.out.Bytes(), want) {
		t.Fatal("a message was written after the close frame")
	}
}

// What the client sent before the hijack, which net/http holds buffered,
// goes through the gate too: the returned Reader holds none of it, which
// reverse_proxy would write to the upstream itself.
func TestClientBytesBufferedBeforeTheHijackGoThroughTheGate(t *testing.T) {
	server, client := tcpConnPair(t)
	pass, refuse := clientFrame(usagetest.OpText, true, 0, []byte(`{"type":"session.update"}`)), clientFrame(usagetest.OpText, true, 0, createResponse("evt_early", 1))
	if _, err := client.Write(usagetest.Stream(refuse, pass)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(server)
	if _, err := br.Peek(len(refuse) + len(pass)); err != nil {
		t.Fatal(err)
	}
	tap := usage.NewRealtimeTap(usage.MaxEvent, usageCeiling(tokenest.Estimate{}))
	spent := &answer{typ: "insufficient_quota", code: "insufficient_quota", message: "spent"}
	gate := &sessionGate{session: &realtimeSession{tap: tap}, every: time.Hour, lookedAt: time.Now(), refusal: spent}
	conn, brw := wrapHijacked(server, bufio.NewReadWriter(br, bufio.NewWriter(server)), tap, gate)
	if n := brw.Reader.Buffered(); n != 0 {
		t.Fatalf("the returned Reader holds %d bytes, which would reach the upstream past the gate", n)
	}
	got := make([]byte, len(pass))
	if _, err := io.ReadFull(conn, got); err != nil || !bytes.Equal(got, pass) {
		t.Fatalf("read %q (%v), want only the event the gate passes", got, err)
	}
	want := errorEvent(*spent, "evt_early")
	client.SetReadDeadline(time.Now().Add(5 * time.Second))
	back := make([]byte, len(want))
	if _, err := io.ReadFull(client, back); err != nil || !bytes.Equal(back[:20], want[:20]) || !bytes.Contains(back, []byte(`"event_id":"evt_early"`)) {
		t.Fatalf("the client got %q (%v), want the error event refusing evt_early", back, err)
	}
}
