package usagetest

import (
	"bytes"
	"encoding/json"
	"path"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws/protocol/eventstream"
)

// An event stream sample (*.eventstream.json) describes the messages of an
// AWS event stream, Bedrock's streaming answer, as JSON: each an event
// (its :event-type) with its JSON payload, or a chunk event whose bytes are
// a model's own event (InvokeModelWithResponseStream: sent as base64 in
// {"bytes": …}, beside Bedrock's padding), or an exception. Read encodes
// them with the AWS SDK's own encoder, so that the bytes the meter reads
// come from an encoder other than the decoder under test.
type streamMessage struct {
	Event     string          `json:"event"`
	Exception string          `json:"exception"`
	Payload   json.RawMessage `json:"payload"`
	Bytes     json.RawMessage `json:"bytes"`
}

// EventStream is the messages an event stream sample describes, encoded.
func EventStream(t testing.TB, description []byte) []byte {
	t.Helper()
	var messages []streamMessage
	if err := json.Unmarshal(description, &messages); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	enc := eventstream.NewEncoder()
	for _, m := range messages {
		var h eventstream.Headers
		payload := []byte(m.Payload)
		switch {
		case m.Exception != "":
			h.Set(":message-type", eventstream.StringValue("exception"))
			h.Set(":exception-type", eventstream.StringValue(m.Exception))
		case m.Bytes != nil:
			h.Set(":message-type", eventstream.StringValue("event"))
			h.Set(":event-type", eventstream.StringValue("chunk"))
			var err error
			if payload, err = json.Marshal(map[string]any{"bytes": compact(t, m.Bytes), "p": "abcdefghijklmnopqrstuvwxyzABCDEFGHIJ"}); err != nil {
				t.Fatal(err)
			}
		default:
			h.Set(":message-type", eventstream.StringValue("event"))
			h.Set(":event-type", eventstream.StringValue(m.Event))
		}
		h.Set(":content-type", eventstream.StringValue("application/json"))
		if err := enc.Encode(&b, eventstream.Message{Headers: h, Payload: compact(t, payload)}); err != nil {
			t.Fatal(err)
		}
	}
	return b.Bytes()
}

// compact is the JSON text without its insignificant space, as a provider
// sends it.
func compact(t testing.TB, text []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, text); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// EventStreamTerminals are where each terminal event of an event stream
// sample ends, in the bytes Read returns: ConverseStream's metadata event,
// and a chunk that carries Anthropic's message_delta or Bedrock's
// amazon-bedrock-invocationMetrics (a model's last chunk), each a final
// report once its message is read whole.
func EventStreamTerminals(t testing.TB, file string) (ends []int) {
	t.Helper()
	b, err := testdata.ReadFile(path.Join("testdata", file))
	if err != nil {
		t.Fatal(err)
	}
	var messages []json.RawMessage
	if err := json.Unmarshal(b, &messages); err != nil {
		t.Fatal(err)
	}
	at := 0
	for _, raw := range messages {
		var m streamMessage
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		at += len(EventStream(t, []byte("["+string(raw)+"]")))
		if m.Event == "metadata" || bytes.Contains(m.Bytes, []byte(`"message_delta"`)) || bytes.Contains(m.Bytes, []byte(`"amazon-bedrock-invocationMetrics"`)) {
			ends = append(ends, at)
		}
	}
	return ends
}
