package usagetest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"strings"
	"testing"
)

// Frame is one WebSocket frame (RFC 6455), encoded by Bytes.
type Frame struct {
	Op      byte
	Fin     bool
	RSV     byte    // 0x40 (RSV1), 0x20 (RSV2), 0x10 (RSV3)
	Mask    []byte  // a 4-byte key, or nil
	LenForm int     // 0: the minimal length encoding; 16 or 64 forces one
	Length  *uint64 // overrides the length field (corrupt frames)
	Payload []byte
}

// The opcodes of RFC 6455.
const (
	OpCont   = 0
	OpText   = 1
	OpBinary = 2
	OpClose  = 8
	OpPing   = 9
	OpPong   = 10
)

// Bytes is the frame on the wire.
func (f Frame) Bytes() []byte {
	b0 := f.Op | f.RSV
	if f.Fin {
		b0 |= 0x80
	}
	var maskBit byte
	if f.Mask != nil {
		maskBit = 0x80
	}
	n := uint64(len(f.Payload))
	if f.Length != nil {
		n = *f.Length
	}
	out := []byte{b0}
	switch {
	case f.LenForm == 64 || (f.LenForm == 0 && n > 65535):
		out = append(out, maskBit|127)
		out = binary.BigEndian.AppendUint64(out, n)
	case f.LenForm == 16 || (f.LenForm == 0 && n > 125):
		out = append(out, maskBit|126)
		out = binary.BigEndian.AppendUint16(out, uint16(n))
	default:
		out = append(out, maskBit|byte(n))
	}
	out = append(out, f.Mask...)
	start := len(out)
	out = append(out, f.Payload...)
	if f.Mask != nil {
		for i := range out[start:] {
			out[start+i] ^= f.Mask[i%4]
		}
	}
	return out
}

// Text is a whole (unfragmented) text message.
func Text(s string) []byte { return Frame{Op: OpText, Fin: true, Payload: []byte(s)}.Bytes() }

// Stream is frames one after another.
func Stream(frames ...[]byte) []byte { return bytes.Join(frames, nil) }

// Done is a response.done event reporting total tokens, of them 1 input
// and 2 output tokens; with size > 0 it is padded to exactly size bytes.
func Done(total int, size int) string {
	head := `{"type":"response.done","event_id":"event_1","response":{"object":"realtime.response","id":"resp_1","status":"completed","output":[],` +
		fmt.Sprintf(`"usage":{"total_tokens":%d,"input_tokens":1,"output_tokens":2,"input_token_details":{"cached_tokens":0}}},"pad":"`, total)
	if size <= 0 {
		return head + `"}`
	}
	if size < len(head)+2 {
		head = fmt.Sprintf(`{"type":"response.done","response":{"usage":{"total_tokens":%d,"input_tokens":1,"output_tokens":2}},"pad":"`, total)
	}
	pad := size - len(head) - 2
	if pad < 0 {
		panic("Done: size too small")
	}
	return head + strings.Repeat("x", pad) + `"}`
}

// AudioDelta is a Realtime API event without usage.
const AudioDelta = `{"type":"response.output_audio.delta","event_id":"event_2","response_id":"resp_1","item_id":"item_1","output_index":0,"content_index":0,"delta":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}`

// Feed writes chunks to w in order, and panics unless w takes each one
// whole and without an error.
func Feed(w io.Writer, chunks ...[]byte) {
	for _, c := range chunks {
		if n, err := w.Write(c); n != len(c) || err != nil {
			panic(fmt.Sprintf("Write = %d, %v; want %d, nil", n, err, len(c)))
		}
	}
}

// Tap is what CheckTap reads of a usage.RealtimeTap: U is usage.Usage,
// which this package cannot name (the tests of package usage import it).
type Tap[U comparable] interface {
	Take() U
	Unmetered() int64
	Faulted() bool
}

// CheckTap fails the test if the tap recovered from a panic, or if the
// usage it has counted since the last Take, or the messages it could not
// meter, are not the ones wanted. It takes the usage.
func CheckTap[U comparable](t testing.TB, tap Tap[U], want U, wantUnmetered int64) {
	t.Helper()
	if tap.Faulted() {
		t.Fatal("the tap recovered from a panic")
	}
	if got := tap.Take(); got != want {
		t.Errorf("usage = %+v, want %+v", got, want)
	}
	if got := tap.Unmetered(); got != wantUnmetered {
		t.Errorf("unmetered = %d, want %d", got, wantUnmetered)
	}
}
