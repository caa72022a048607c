package ratelimit

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
	"github.com/rolter/caddy-ratelimit/internal/wsframe"
)

// The design of a realtime session's budget gate is in the package doc, section "Realtime sessions".

// respondingEvents are the client events that make the model respond:
// response.create asks for a response, and the input audio buffer is what
// server VAD, the Realtime API's default turn detection, commits and
// answers on its own.
var respondingEvents = map[string]bool{
	"response.create":           true,
	"input_audio_buffer.append": true,
	"input_audio_buffer.commit": true,
}

// maxHeldEvent is the largest message of a client that is held whole and
// read. A larger one cannot be read before its first bytes go: it is
// judged unread, as an event that may make the model respond.
const maxHeldEvent = 256 << 10

// errClientFraming ends a session whose client sends what no WebSocket
// frame can be (RFC 6455 tells the server to fail the connection): past
// it, no event can be told from another.
var errClientFraming = errors.New("rolter_ratelimit: the client's WebSocket framing is corrupt")

// clientEvents reads the WebSocket frames a client sends (RFC 6455:
// masked, messages possibly fragmented, control frames between fragments)
// from src, and gives them to its reader byte for byte as they came, but
// for the order of messages and control frames: each data message is held
// until it is whole (up to maxHeldEvent) and then passed on whole or
// dropped, as judge says, while control frames go on at once. Not safe for
// concurrent use: reverse_proxy reads a connection from one goroutine.
type clientEvents struct {
	src   io.Reader
	judge func(msg []byte, whole bool) (pass bool)
	in    []byte // what one Read of src returned
	out   []byte // frames ready for the reader, of which sent are read
	sent  int
	err   error // src's, or corrupt framing; returned once out is read

	// The frame being read.
	frames  wsframe.Reader
	fin     bool // the message's last frame
	control bool
	to      *[]byte // where the frame's bytes go: &out, &held, or nil (dropped)

	// The data message being read.
	inMessage bool
	msgTo     *[]byte // where its frames go
	held      []byte  // its frames as they came, while held
	payload   []byte  // their payload, unmasked
}

func newClientEvents(src io.Reader, judge func(msg []byte, whole bool) bool) *clientEvents {
	return &clientEvents{src: src, judge: judge, in: make([]byte, 16<<10)}
}

// Read gives the frames that are ready, reading src until some are.
func (c *clientEvents) Read(p []byte) (int, error) {
	for len(c.out) == 0 {
		if c.err != nil {
			return 0, c.err
		}
		n, err := c.src.Read(c.in)
		c.parse(c.in[:n])
		if err != nil && c.err == nil {
			c.err = err
		}
	}
	n := copy(p, c.out[c.sent:])
	if c.sent += n; c.sent == len(c.out) {
		c.out, c.sent = c.out[:0], 0
		if cap(c.out) > realtimeRetainedBuffer {
			c.out = nil
		}
	}
	return n, nil
}

func (c *clientEvents) parse(b []byte) {
	for len(b) > 0 && c.err == nil {
		var into *[]byte
		if c.to == &c.held {
			into = &c.payload
		}
		var step wsframe.Step
		b, step = c.frames.Next(b, into)
		switch {
		case step.Begins:
			c.beginFrame(step.Frame)
		case c.to != nil:
			*c.to = append(*c.to, step.Chunk...)
		}
		if step.Ends && c.err == nil {
			c.endFrame()
		}
	}
}

// beginFrame interprets the complete header of the frame f, and sends it
// where the frame goes.
func (c *clientEvents) beginFrame(f wsframe.Frame) {
	if f.Corrupt(c.inMessage) {
		c.err = errClientFraming
		return
	}
	header := c.frames.Header()
	switch {
	case f.Control():
		c.to = &c.out // control frames go on at once, between fragments if need be
	case f.Op != wsframe.OpContinuation && f.RSV1:
		// Compressed (permessage-deflate, which the handler does not
		// offer): unreadable here.
		c.inMessage = true
		c.msgTo = c.decide(nil, false)
	case f.Op != wsframe.OpContinuation:
		c.inMessage, c.msgTo = true, &c.held
		fallthrough
	default:
		if c.msgTo == &c.held && uint64(len(c.held)+len(header))+f.Length > maxHeldEvent {
			c.msgTo = c.decide(c.payload, false)
		}
	}
	if !f.Control() {
		c.to = c.msgTo
	}
	if c.to != nil {
		*c.to = append(*c.to, header...)
	}
	c.fin, c.control = f.Fin, f.Control()
}

// decide judges the message held so far, whole or not, and passes on what
// is held of it if it passes; it returns where its next frames go.
func (c *clientEvents) decide(msg []byte, whole bool) *[]byte {
	pass := c.judge(msg, whole)
	if pass {
		c.out = append(c.out, c.held...)
	}
	c.release()
	if pass {
		return &c.out
	}
	return nil
}

// release empties the held message, keeping a small buffer for the next.
func (c *clientEvents) release() {
	if cap(c.held) > realtimeRetainedBuffer {
		c.held, c.payload = nil, nil
	}
	c.held, c.payload = c.held[:0], c.payload[:0]
}

func (c *clientEvents) endFrame() {
	if c.control || !c.fin {
		return
	}
	if c.msgTo == &c.held {
		c.decide(c.payload, true)
	}
	c.inMessage, c.msgTo = false, nil
}

// realtimeRetainedBuffer is the largest buffer of a held message kept for
// the next one.
const realtimeRetainedBuffer = 64 << 10

// clientEvent is what the gate reads of a client event: the value of its
// every top-level "type" key (a JSON object may repeat a key, and a server
// may read either), and its event_id.
type clientEvent struct {
	types   []string
	eventID string
}

// readClientEvent reads msg as one JSON object, with keys compared
// exactly, as the upstream compares them; ok is false for anything else,
// or a type that is not a string.
func readClientEvent(msg []byte) (ev clientEvent, ok bool) {
	d := json.NewDecoder(bytes.NewReader(msg))
	if t, err := d.Token(); err != nil || t != json.Delim('{') {
		return ev, false
	}
	for d.More() {
		t, err := d.Token()
		if err != nil {
			return ev, false
		}
		var value json.RawMessage
		if d.Decode(&value) != nil {
			return ev, false
		}
		switch t {
		case "type":
			var typ string
			if json.Unmarshal(value, &typ) != nil {
				return ev, false
			}
			ev.types = append(ev.types, typ)
		case "event_id":
			_ = json.Unmarshal(value, &ev.eventID) // only echoed back
		}
	}
	if t, err := d.Token(); err != nil || t != json.Delim('}') {
		return ev, false
	}
	if _, err := d.Token(); err != io.EOF {
		return ev, false // more than one value
	}
	return ev, true
}

// responds reports whether an event whose message was read (ok) as ev may
// make the model respond: it names such a type, or it could not be read.
func (ev clientEvent) responds(ok bool) bool {
	if !ok {
		return true
	}
	for _, t := range ev.types {
		if respondingEvents[t] {
			return true
		}
	}
	return false
}

// sessionGate decides which events of a session under a budget go to the
// upstream. It looks at the budgets of the session's chain again before an
// event that may make the model respond whenever a response has ended
// since it last looked (after charging it, so that the look counts it), or
// the flush interval has passed; in between, such an event is decided as
// the last look said.
type sessionGate struct {
	session *realtimeSession
	budgets []limiter.Limit // the chain's enforced budgets, alone
	every   time.Duration
	ctx     context.Context

	mu       sync.Mutex
	seen     int64     // the responses the tap had counted at the last look
	lookedAt time.Time // the last look; the admission is the first
	refusal  *answer   // the budgets' refusal at the last look; nil: none
}

// newSessionGate is the gate of an admitted session whose chain has
// budgets, or nil; ctx bounds its looks.
func newSessionGate(ctx context.Context, s *realtimeSession) *sessionGate {
	var budgets []limiter.Limit
	for _, l := range s.chain {
		if l.Shadow || l.Budgets.Max == [limiter.NumBudgetPeriods]int64{} {
			continue
		}
		caps := limiter.Caps{Budgets: l.Budgets}
		l.Caps = &caps
		budgets = append(budgets, l)
	}
	if len(budgets) == 0 {
		return nil
	}
	return &sessionGate{session: s, budgets: budgets, every: s.h.flushInterval(), ctx: ctx, lookedAt: time.Now()}
}

// judge is the error event that refuses the client's message msg (whole,
// or its first part), or nil: the message goes on.
func (g *sessionGate) judge(msg []byte, whole bool) []byte {
	g.mu.Lock()
	defer g.mu.Unlock()
	fresh := g.session.tap.Responses() == g.seen && time.Since(g.lookedAt) < g.every
	if fresh && g.refusal == nil {
		return nil
	}
	var ev clientEvent
	ok := false
	if whole {
		ev, ok = readClientEvent(msg)
	}
	if !ev.responds(ok) {
		return nil
	}
	if !fresh {
		g.look()
	}
	if g.refusal == nil {
		return nil
	}
	g.refused(ev)
	return errorEvent(*g.refusal, ev.eventID)
}

// look charges what the session's responses reported, then reads its
// budgets. A budget that cannot be read refuses: a spend that cannot be
// counted is never let through.
func (g *sessionGate) look() {
	g.seen = g.session.tap.Responses() // before the charge, which takes at least their usage
	g.session.flush()
	d, err := g.session.h.store.Peek(g.ctx, g.budgets)
	g.lookedAt = time.Now()
	if err != nil {
		g.session.h.warn.log(g.session.h.logger, "rate limit store unavailable; refusing the responses of realtime sessions under a budget (their spend cannot be counted)", zap.Error(err))
		g.refusal = &storeUnavailable
		return
	}
	g.refusal = nil
	if ref := limiter.RefusalOf(g.budgets, d); ref.First >= 0 {
		l := g.budgets[ref.First]
		g.refusal = &answer{message: refusalMessage(ref, g.budgets, d.Reserve.Cost), typ: limiter.Budget.ErrorType(), code: "insufficient_quota",
			scope: l.Scope, kind: limiter.Budget.String(), window: ref.WindowName(), id: l.ID}
	}
}

// refused counts an event refused by a budget.
func (g *sessionGate) refused(ev clientEvent) {
	a, h := g.refusal, g.session.h
	if a.kind == "" { // the store failed
		return
	}
	refusalsTotal.WithLabelValues(a.scope, a.kind, a.window, "false").Inc()
	if h.logger.Core().Enabled(zap.DebugLevel) {
		h.logger.Debug("realtime event refused", zap.String("scope", a.scope), zap.String("id", a.id), zap.String("kind", a.kind),
			zap.String("window", a.window), zap.Strings("type", ev.types))
	}
}

// errorEvent is the Realtime API's error server event for a, in reply to
// the client event eventID ("" if it named none), as a WebSocket text
// frame from the server.
func errorEvent(a answer, eventID string) []byte {
	type realtimeError struct {
		Type    string  `json:"type"`
		Code    string  `json:"code"`
		Message string  `json:"message"`
		Param   *string `json:"param"`
		EventID *string `json:"event_id"`
	}
	ev := struct {
		Type    string        `json:"type"`
		EventID string        `json:"event_id"`
		Error   realtimeError `json:"error"`
	}{Type: "error", EventID: "event_" + rand.Text(), Error: realtimeError{Type: a.typ, Code: a.code, Message: a.message}}
	if eventID != "" {
		ev.Error.EventID = &eventID
	}
	payload, _ := json.Marshal(ev) // strings only: never fails
	const finText = 0x81
	frame := wsframe.AppendHeader(make([]byte, 0, 10+len(payload)), finText, len(payload))
	return append(frame, payload...)
}
