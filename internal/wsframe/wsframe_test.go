package wsframe

import (
	"bytes"
	"testing"
)

// frame is a frame of op with payload, masked with key when it is not nil.
func frame(b0 byte, payload, key []byte) []byte {
	b := AppendHeader(nil, b0, len(payload))
	masked := bytes.Clone(payload)
	if key != nil {
		b[1] |= 0x80
		b = append(b, key...)
		for i := range masked {
			masked[i] ^= key[i%4]
		}
	}
	return append(b, masked...)
}

// A stream fed a byte at a time gives every frame's header, its payload
// as sent and unmasked, and its end, for every length form.
func TestReaderFollowsFramesOfEveryLengthFormSplitAtEveryByte(t *testing.T) {
	key := []byte{1, 2, 3, 4}
	payloads := [][]byte{nil, []byte("ping"), bytes.Repeat([]byte("x"), 126), bytes.Repeat([]byte("y"), 70000)}
	var stream []byte
	for i, p := range payloads {
		k := key
		if i%2 == 1 {
			k = nil
		}
		stream = append(stream, frame(0x82, p, k)...)
	}
	var r Reader
	var unmasked, sent []byte
	var begun, ended int
	for i := range stream {
		rest, s := r.Next(stream[i:i+1], &unmasked)
		if len(rest) != 0 && !s.Begins {
			t.Fatalf("byte %d: %d bytes left unread", i, len(rest))
		}
		if s.Begins {
			if s.Frame.Length != uint64(len(payloads[begun])) || s.Frame.Op != OpBinary || !s.Frame.Fin || s.Frame.Corrupt(false) {
				t.Fatalf("frame %d: %+v", begun, s.Frame)
			}
			sent = append(sent, r.Header()...)
			begun++
		}
		sent = append(sent, s.Chunk...)
		if s.Ends {
			ended++
		}
	}
	if !bytes.Equal(sent, stream) || !bytes.Equal(unmasked, bytes.Join(payloads, nil)) || begun != 4 || ended != 4 || !r.Between() {
		t.Fatalf("begun %d, ended %d, the stream as sent: %v, unmasked: %v", begun, ended, bytes.Equal(sent, stream), bytes.Equal(unmasked, bytes.Join(payloads, nil)))
	}
}

func TestCorruptIsWhatRFC6455FailsAConnectionFor(t *testing.T) {
	for _, c := range []struct {
		f         Frame
		inMessage bool
		corrupt   bool
	}{
		{Frame{Op: OpText, Fin: true}, false, false},
		{Frame{Op: OpText, RSV1: true}, false, false},
		{Frame{Op: OpContinuation}, true, false},
		{Frame{Op: 9, Fin: true, Length: 125}, true, false},
		{Frame{Op: OpText}, true, true},
		{Frame{Op: OpContinuation}, false, true},
		{Frame{Op: OpContinuation, RSV1: true}, true, true},
		{Frame{Op: 9, Length: 1}, false, true},
		{Frame{Op: 9, Fin: true, Length: 126}, false, true},
		{Frame{Op: 3, Fin: true}, false, true},
		{Frame{Op: 11, Fin: true}, false, true},
		{Frame{Op: OpText, Fin: true, Reserved: true}, false, true},
		{Frame{Op: OpText, Fin: true, Length: 1 << 63}, false, true},
	} {
		if got := c.f.Corrupt(c.inMessage); got != c.corrupt {
			t.Errorf("%+v in a message %v: Corrupt() = %v, want %v", c.f, c.inMessage, got, c.corrupt)
		}
	}
}
