package tokenest

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"testing"
)

// apiPaths are a path of each API and of each output capped at 0.
var apiPaths = []string{
	chatPath, completionsPath, embeddingsPath, responsesPath, "/v1/responses/input_tokens",
	messagesPath, "/v1/messages/count_tokens", geminiPath, "/v1beta/models/m:countTokens",
	conversePath, invokePath, coherePath,
}

// FuzzOf holds Of, for every API, to: no panic; the estimate's invariants;
// Known exactly when the body is a JSON object (as json.Valid has it); the
// estimate of reference (encoding/json and maps) when no member is given
// twice; the same estimate with the body indented, and under a prefix.
func FuzzOf(f *testing.F) {
	for _, c := range inputCases {
		f.Add(c.path, []byte(c.body))
	}
	for _, c := range outputCases {
		f.Add(c.path, []byte(c.body))
	}
	f.Add(chatPath, []byte(typicalChat))
	f.Add(chatPath, imageChat(100))
	f.Add(conversePath, []byte(converseBody))
	f.Add(invokePath, []byte(invokeBody))
	f.Add(coherePath, []byte(cohereBody))
	f.Add("/x", []byte(`{"a":"\ud83d\ude00\ud83d","b":[1,-0.5e3,true,null,{}]}`))
	g := generator{rand.New(rand.NewPCG(3, 4)), &bytes.Buffer{}}
	for i := range 40 {
		g.out.Reset()
		g.object("request", 0)
		f.Add(apiPaths[i%len(apiPaths)], bytes.Clone(g.out.Bytes()))
	}
	f.Fuzz(func(t *testing.T, path string, body []byte) {
		checkEstimate(t, path, ofPath(path, body))
		first := bytes.TrimLeft(body, " \t\r\n")
		object := json.Valid(body) && first[0] == '{'
		twice := object && hasDuplicateKeys(body)
		var indented bytes.Buffer
		if object {
			if err := json.Indent(&indented, body, "", "\t"); err != nil {
				t.Fatal(err)
			}
		}
		for _, p := range apiPaths {
			e := ofPath(p, body)
			checkEstimate(t, p, e)
			if e.Known != object {
				t.Fatalf("%s: Known %v, but the body is a JSON object: %v", p, e.Known, object)
			}
			if object && !twice {
				if want := reference(p, body); e != want {
					t.Fatalf("%s: %+v, reference %+v", p, e, want)
				}
			}
			if object {
				if e2 := ofPath(p, indented.Bytes()); e2 != e {
					t.Fatalf("%s: %+v indented, %+v not", p, e2, e)
				}
			}
			if e2 := ofPath("/gateway/openai"+p, body); e2 != e {
				t.Fatalf("%s: %+v under a prefix, %+v not", p, e2, e)
			}
		}
	})
}

func checkEstimate(t *testing.T, path string, e Estimate) {
	t.Helper()
	switch {
	case !e.Known && e != (Estimate{}):
		t.Fatalf("%s: unknown but not zero: %+v", path, e)
	case e.Input < 0 || e.Input > limit || e.Output < 0 || e.Output > limit:
		t.Fatalf("%s: out of [0, 1<<40]: %+v", path, e)
	case !e.Capped && e.Output != 0:
		t.Fatalf("%s: output without a cap: %+v", path, e)
	}
}
