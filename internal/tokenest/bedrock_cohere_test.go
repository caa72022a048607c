package tokenest

import (
	"bytes"
	"encoding/json"
	"testing"
	"unicode/utf8"

	"github.com/rolter/caddy-ratelimit/internal/llmapi"
)

// chars is the characters of s, which must have no escapes.
func chars(s string) int64 { return int64(utf8.RuneCountInString(s)) }

// compactChars is the characters of the JSON value s as compact JSON, as
// encoding/json compacts it; s must have no escapes.
func compactChars(t *testing.T, s string) int64 {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(s)); err != nil {
		t.Fatalf("%s: %v", s, err)
	}
	return chars(b.String())
}

// Converse's pieces that count as JSON.
const (
	converseToolInput  = `{"city": "Paris", "unit": "celsius"}`
	converseToolResult = `{"temp": 21, "sky": "clear"}`
	converseToolConfig = `{"tools": [{"toolSpec": {"name": "get_weather", "description": "Current weather of a city.",
      "inputSchema": {"json": {"type": "object", "properties": {"city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}}],
    "toolChoice": {"auto": {}}}`
)

// converseBody is a Converse request as the AWS SDK's ConverseCommand sends
// it (the model is in the path): a system prompt and a cache point, a
// question with a photo, a toolUse and its toolResult, the tools.
const converseBody = `{
  "messages": [
    {"role": "user", "content": [
      {"text": "What is the weather where this photo was taken?"},
      {"image": {"format": "jpeg", "source": {"bytes": "/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDAAgGBgcGBQgHBwcJCQgKDBQNDAsLDBkSEw8U"}}}
    ]},
    {"role": "assistant", "content": [
      {"reasoningContent": {"reasoningText": {"text": "The tower is the Eiffel Tower.", "signature": "EqoBCkgIARABGAIiQ"}}},
      {"text": "It looks like Paris. Let me check."},
      {"toolUse": {"toolUseId": "tooluse_kZJMlvQmRJ6eAyJE5GIl7Q", "name": "get_weather", "input": ` + converseToolInput + `}}
    ]},
    {"role": "user", "content": [
      {"toolResult": {"toolUseId": "tooluse_kZJMlvQmRJ6eAyJE5GIl7Q", "status": "success",
        "content": [{"json": ` + converseToolResult + `}, {"text": "Updated 5 minutes ago."}]}},
      {"guardContent": {"text": {"text": "Is it safe to swim in the Seine?", "qualifiers": ["query"]}}}
    ]}
  ],
  "system": [{"text": "You are a travel assistant. Answer in one sentence."}, {"cachePoint": {"type": "default"}}],
  "inferenceConfig": {"maxTokens": 1024, "temperature": 0.2, "topP": 0.9, "stopSequences": ["END"]},
  "toolConfig": ` + converseToolConfig + `,
  "additionalModelRequestFields": {"top_k": 250},
  "performanceConfig": {"latency": "standard"}
}`

// Anthropic's pieces on Bedrock that count as JSON.
const (
	invokeToolInput = `{"path":"./..."}`
	invokeTools     = `{"name":"run_tests","description":"Run the tests of a package.","input_schema":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}}`
)

// invokeBody is an Anthropic model's InvokeModel body, as the AWS SDK's
// InvokeModelCommand sends it: Anthropic's Messages with its
// anthropic_version, and no model.
const invokeBody = `{"anthropic_version":"bedrock-2023-05-31","max_tokens":2048,` +
	`"system":[{"type":"text","text":"You review pull requests.","cache_control":{"type":"ephemeral"}}],` +
	`"messages":[{"role":"user","content":[{"type":"text","text":"Review this diff:"},` +
	`{"type":"document","source":{"type":"text","media_type":"text/plain","data":"- a := 1\n+ a := 2"}},` +
	`{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB"}}]},` +
	`{"role":"assistant","content":[{"type":"thinking","thinking":"Run the tests first.","signature":"ErUBCkYIBRgCIkB"},` +
	`{"type":"tool_use","id":"toolu_bdrk_01","name":"run_tests","input":` + invokeToolInput + `}]},` +
	`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_bdrk_01","content":"ok  pkg  0.4s"}]}],` +
	`"tools":[` + invokeTools + `],"temperature":0.3}`

// Cohere's pieces that count as JSON.
const (
	cohereDocumentPart = `{"id":"p1","data":{"plan":"Enterprise","features":"SSO, audit logs"}}`
	cohereTool         = `{"type":"function","function":{"name":"search_pricing","description":"Search the pricing page.","parameters":{"type":"object","properties":{"query":{"type":"string"}},"required":["query"]}}}`
	cohereDocument     = `{"id":"faq","data":{"title":"FAQ","snippet":"All plans include email support."}}`
	cohereDocument2    = `"A plain string document."`
)

// cohereBody is a Cohere v2 chat request as Cohere's SDK sends it: a system
// message, a question with an image, a tool call with its plan, the tool's
// result as a document, the tools and documents.
const cohereBody = `{"model":"command-a-03-2025","stream":true,"max_tokens":800,"temperature":0.3,"messages":[` +
	`{"role":"system","content":"You answer from the documents."},` +
	`{"role":"user","content":[{"type":"text","text":"Which plan includes SSO?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}}]},` +
	`{"role":"assistant","tool_plan":"I will search the pricing page.","tool_calls":[{"id":"search_pricing_2k3j","type":"function","function":{"name":"search_pricing","arguments":"{\"query\":\"SSO\"}"}}]},` +
	`{"role":"tool","tool_call_id":"search_pricing_2k3j","content":[{"type":"document","document":` + cohereDocumentPart + `}]}],` +
	`"tools":[` + cohereTool + `],"documents":[` + cohereDocument + `,` + cohereDocument2 + `],"citation_options":{"mode":"FAST"}}`

// TestBedrockAndCohereRequestsAsTheirSDKsSendThem reads whole requests of
// Bedrock's Converse and InvokeModel (of each model family) and of Cohere's
// v2 chat, each field that counts said apart.
func TestBedrockAndCohereRequestsAsTheirSDKsSendThem(t *testing.T) {
	for _, c := range []struct {
		name, path, body string
		chars, media     int64
		output           int64
		capped           bool
	}{
		{"converse", conversePath, converseBody,
			chars("What is the weather where this photo was taken?") + chars("It looks like Paris. Let me check.") +
				chars("get_weather") + compactChars(t, converseToolInput) + // the toolUse; its id and the reasoning nothing
				compactChars(t, converseToolResult) + chars("Updated 5 minutes ago.") + // the toolResult's blocks
				chars("Is it safe to swim in the Seine?") + // the guardContent's text
				chars("You are a travel assistant. Answer in one sentence.") + // system; its cachePoint nothing
				compactChars(t, converseToolConfig),
			1, 1024, true},
		{"converse-stream, no inferenceConfig", "/model/amazon.nova-pro-v1:0/converse-stream",
			`{"messages":[{"role":"user","content":[{"text":"Hello"}]}]}`, 5, 0, 0, false},
		{"invoke Anthropic", invokePath, invokeBody,
			chars("You review pull requests.") + chars("Review this diff:") + chars("- a := 1\n+ a := 2") +
				chars("run_tests") + compactChars(t, invokeToolInput) + chars("ok  pkg  0.4s") + compactChars(t, invokeTools),
			1, 2048, true},
		{"invoke Meta Llama", "/model/meta.llama3-1-70b-instruct-v1:0/invoke",
			`{"prompt":"<|begin_of_text|><|start_header_id|>user<|end_header_id|>Hi<|eot_id|>","max_gen_len":512,"temperature":0.5,"top_p":0.9}`,
			chars("<|begin_of_text|><|start_header_id|>user<|end_header_id|>Hi<|eot_id|>"), 0, 512, true},
		{"invoke Mistral", "/model/mistral.mistral-large-2402-v1:0/invoke",
			`{"prompt":"<s>[INST] Hi [/INST]","max_tokens":400,"top_k":50}`, chars("<s>[INST] Hi [/INST]"), 0, 400, true},
		{"invoke DeepSeek", "/model/us.deepseek.r1-v1:0/invoke",
			`{"prompt":"Why is the sky blue?","max_tokens":1000,"stop":["</s>"]}`, chars("Why is the sky blue?"), 0, 1000, true},
		{"invoke Amazon Titan", "/model/amazon.titan-text-premier-v1:0/invoke",
			`{"inputText":"User: Hi\nBot:","textGenerationConfig":{"maxTokenCount":512,"stopSequences":["User:"],"temperature":0,"topP":0.9}}`,
			chars("User: Hi\nBot:"), 0, 512, true},
		// Nova's InvokeModel body has Converse's blocks, without a type, and
		// its own cap: neither is read (Converse is how Nova is called).
		{"invoke Amazon Nova: not read", "/model/amazon.nova-lite-v1:0/invoke",
			`{"schemaVersion":"messages-v1","system":[{"text":"Be brief."}],"messages":[{"role":"user","content":[{"text":"Hi"}]}],"inferenceConfig":{"max_new_tokens":300}}`,
			0, 0, 0, false},
		{"cohere", coherePath, cohereBody,
			chars("You answer from the documents.") + chars("Which plan includes SSO?") +
				chars("I will search the pricing page.") + chars("search_pricing") + chars(`{"query":"SSO"}`) +
				compactChars(t, cohereDocumentPart) + compactChars(t, cohereTool) +
				compactChars(t, cohereDocument) + compactChars(t, cohereDocument2),
			1, 800, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, ok := read(llmapi.Of(c.path), []byte(c.body), false)
			if want := (tally{chars: c.chars, media: c.media}); !ok || r.tally != want {
				t.Errorf("read = %+v (known %v), want %+v", r.tally, ok, want)
			}
			e := ofPath(c.path, []byte(c.body))
			in := (c.chars+3)/4 + c.media*MediaTokens
			if want := (Estimate{Input: in, Output: c.output, Choices: 1, Capped: c.capped, Known: true}); e != want {
				t.Errorf("Of = %+v, want %+v", e, want)
			}
			if ref := reference(c.path, []byte(c.body)); ref != e {
				t.Errorf("Of = %+v, reference %+v", e, ref)
			}
		})
	}
}

// A Cohere document part counts its document as JSON, as the request's
// documents do: it is what the model reads (a tool's result, most often).
// A document part with a source is Anthropic's, and counts by its source.
func TestADocumentPartWithoutASourceCountsItsDocumentAsJSON(t *testing.T) {
	for _, c := range []struct {
		part         string
		chars, media int64
	}{
		{`{"type":"document","document":{"data":{"a":"bc"}}}`, compactChars(t, `{"data":{"a":"bc"}}`), 0},
		{`{"document":{"data":"x"},"type":"document"}`, compactChars(t, `{"data":"x"}`), 0},
		{`{"type":"document","document":"abc"}`, 5, 0},
		{`{"type":"document","source":{"type":"text","data":"abc"},"document":{"data":"long long long"}}`, 3, 0},
		{`{"type":"document","source":{"type":"base64","data":"JVBE"},"document":{"data":"x"}}`, 0, 1},
		{`{"type":"document","source":null,"document":{"data":"x"}}`, 0, 1},
		{`{"type":"document"}`, 0, 1},
		{`{"type":"text","text":"ab","document":{"data":"x"}}`, 2, 0},
	} {
		body := `{"messages":[{"role":"tool","content":[` + c.part + `]}]}`
		for _, path := range []string{coherePath, chatPath, messagesPath, invokePath} {
			r, ok := read(llmapi.Of(path), []byte(body), false)
			if want := (tally{chars: c.chars, media: c.media}); !ok || r.tally != want {
				t.Errorf("%s %s: %+v (known %v), want %+v", path, c.part, r.tally, ok, want)
			}
		}
	}
}
