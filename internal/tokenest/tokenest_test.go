package tokenest

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/rolter/caddy-ratelimit/internal/llmapi"
)

// ofPath is the estimate of a body sent to path.
func ofPath(path string, body []byte) Estimate { return Of(llmapi.Of(path), body) }

const (
	chatPath        = "/v1/chat/completions"
	completionsPath = "/v1/completions"
	embeddingsPath  = "/v1/embeddings"
	responsesPath   = "/v1/responses"
	messagesPath    = "/v1/messages"
	geminiPath      = "/v1beta/models/gemini-2.5-flash:generateContent"
	vertexClaude    = "/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-sonnet-4@20250514:rawPredict"
	conversePath    = "/model/us.anthropic.claude-sonnet-4-20250514-v1:0/converse"
	invokePath      = "/model/anthropic.claude-3-5-haiku-20241022-v1:0/invoke-with-response-stream"
	coherePath      = "/v2/chat"
)

// inputCase is a body and what its input counts: characters, token ids and
// media parts, before they are made tokens.
type inputCase struct {
	name, path, body     string
	chars, tokens, media int64
}

// inputCases have one case for each field of each API that counts.
var inputCases = []inputCase{
	// OpenAI chat completions.
	{"chat content string", chatPath,
		`{"model":"gpt-4o","messages":[{"role":"user","content":"Hello, world"}]}`, 12, 0, 0},
	{"chat content parts: text counts, image_url with a data URL is media", chatPath,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"What is this?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo=","detail":"high"}}]}]}`, 13, 0, 1},
	{"chat input_audio and file parts are media", chatPath,
		`{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"UklGRg==","format":"wav"}},{"type":"file","file":{"file_data":"JVBERi0=","filename":"a.pdf"}}]}]}`, 0, 0, 2},
	{"chat refusal part counts its refusal", chatPath,
		`{"messages":[{"role":"assistant","content":[{"type":"refusal","refusal":"No."}]}]}`, 3, 0, 0},
	{"chat message name", chatPath,
		`{"messages":[{"role":"user","name":"alice","content":"hi"}]}`, 7, 0, 0},
	{"chat tool_calls: function name and arguments", chatPath,
		`{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},{"role":"tool","tool_call_id":"call_1","content":"Sunny"}]}`,
		11 + 16 + 5, 0, 0},
	{"chat tool_calls: custom tool name and input", chatPath,
		`{"messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"custom","custom":{"name":"sh","input":"ls -la"}}]}]}`, 2 + 6, 0, 0},
	{"chat legacy function_call", chatPath,
		`{"messages":[{"role":"assistant","function_call":{"name":"f","arguments":"{}"}}]}`, 3, 0, 0},
	{"chat tools as compact JSON", chatPath,
		`{"messages":[],"tools":[{"type":"function","function":{"name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]}`, 158, 0, 0},
	{"chat legacy functions as compact JSON", chatPath,
		`{"messages":[],"functions":[{"name":"f","parameters":{}}]}`, 28, 0, 0},

	// OpenAI legacy completions.
	{"completions prompt string", completionsPath, `{"model":"gpt-3.5-turbo-instruct","prompt":"Once upon a time"}`, 16, 0, 0},
	{"completions prompt strings", completionsPath, `{"prompt":["ab","cde"]}`, 5, 0, 0},
	{"completions prompt token ids: one token each", completionsPath, `{"prompt":[1212,318,257]}`, 0, 3, 0},
	{"completions prompt arrays of token ids", completionsPath, `{"prompt":[[1,2],[3]]}`, 0, 3, 0},
	{"completions suffix", completionsPath, `{"prompt":"def f():","suffix":"return 1"}`, 16, 0, 0},

	// OpenAI embeddings.
	{"embeddings input string", embeddingsPath, `{"model":"text-embedding-3-small","input":"The food was delicious"}`, 22, 0, 0},
	{"embeddings input strings", embeddingsPath, `{"input":["abc","de"]}`, 5, 0, 0},
	{"embeddings input token ids", embeddingsPath, `{"input":[5,6,7,8]}`, 0, 4, 0},
	{"embeddings input arrays of token ids", embeddingsPath, `{"input":[[5,6],[7]],"encoding_format":"float"}`, 0, 3, 0},

	// OpenAI Responses.
	{"responses input string", responsesPath, `{"model":"gpt-5","input":"Tell me a joke"}`, 14, 0, 0},
	{"responses instructions", responsesPath, `{"instructions":"Be brief.","input":"Hi"}`, 11, 0, 0},
	{"responses message parts: input_text counts, input_image, input_file and input_audio are media", responsesPath,
		`{"input":[{"role":"user","content":[{"type":"input_text","text":"Describe"},{"type":"input_image","image_url":"data:image/jpeg;base64,/9j/4AAQ"},{"type":"input_file","file_data":"data:application/pdf;base64,JVBE","filename":"a.pdf"},{"type":"input_audio","input_audio":{"data":"AAAA","format":"mp3"}}]}]}`,
		8, 0, 3},
	{"responses message items: output_text, content string", responsesPath,
		`{"input":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Sure.","annotations":[]}]},{"role":"user","content":"More"}]}`, 9, 0, 0},
	{"responses function_call name and arguments, function_call_output output", responsesPath,
		`{"input":[{"type":"function_call","call_id":"c1","name":"lookup","arguments":"{\"q\":1}"},{"type":"function_call_output","call_id":"c1","output":"42"}]}`, 6 + 7 + 2, 0, 0},
	{"responses custom_tool_call name and input, its output parts", responsesPath,
		`{"input":[{"type":"custom_tool_call","call_id":"c","name":"sh","input":"ls -la"},{"type":"custom_tool_call_output","call_id":"c","output":[{"type":"input_text","text":"ok"}]}]}`, 2 + 6 + 2, 0, 0},
	{"responses tools as compact JSON", responsesPath,
		`{"input":"x","tools":[{"type":"function","name":"f","parameters":{}}]}`, 1 + 46, 0, 0},

	// Anthropic Messages.
	{"messages system string and content string", messagesPath,
		`{"model":"claude-sonnet-4-5","max_tokens":1024,"system":"You are terse.","messages":[{"role":"user","content":"Hi"}]}`, 16, 0, 0},
	{"messages system text blocks", messagesPath,
		`{"system":[{"type":"text","text":"Rule one."},{"type":"text","text":"Rule two.","cache_control":{"type":"ephemeral"}}],"messages":[]}`, 18, 0, 0},
	{"messages text counts, image is media", messagesPath,
		`{"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}},{"type":"text","text":"What is it?"}]}]}`, 11, 0, 1},
	{"messages document: a PDF is media, a text source counts its data, a content source its blocks", messagesPath,
		`{"messages":[{"role":"user","content":[{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"JVBERi0xLjQ="}},{"type":"document","source":{"type":"text","media_type":"text/plain","data":"Plain text."}},{"type":"document","source":{"type":"content","content":[{"type":"text","text":"abc"}]}},{"type":"document","source":{"type":"url","url":"https://example.com/a.pdf"}}]}]}`,
		11 + 3, 0, 2},
	{"messages tool_use name and input as compact JSON", messagesPath,
		`{"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"get_weather","input":{"city":"Paris"}}]}]}`, 11 + 16, 0, 0},
	{"messages tool_result content string and blocks", messagesPath,
		`{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"Sunny"},{"type":"tool_result","tool_use_id":"t2","content":[{"type":"text","text":"Rain"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBO"}}]}]}]}`,
		5 + 4, 0, 1},
	{"messages tools as compact JSON", messagesPath,
		`{"tools":[{"name":"get_weather","description":"Weather of a city","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}},{"type":"web_search_20250305","name":"web_search","max_uses":5}],"messages":[]}`,
		129 + 63, 0, 0},

	// Gemini.
	{"gemini contents parts text", geminiPath, `{"contents":[{"role":"user","parts":[{"text":"Explain"}]}]}`, 7, 0, 0},
	{"gemini inlineData and fileData are media", geminiPath,
		`{"contents":[{"parts":[{"inlineData":{"mimeType":"image/png","data":"iVBORw0KGgo="}},{"fileData":{"mimeType":"video/mp4","fileUri":"gs://b/v.mp4"}}]}]}`, 0, 0, 2},
	{"gemini inline_data and file_data (snake_case) are media", geminiPath,
		`{"contents":[{"parts":[{"inline_data":{"mime_type":"image/png","data":"iVBORw0KGgo="}},{"file_data":{"mime_type":"audio/mp3","file_uri":"https://x/a.mp3"}},{"text":"ab"}]}]}`, 2, 0, 2},
	{"gemini functionCall and functionResponse as compact JSON", geminiPath,
		`{"contents":[{"role":"model","parts":[{"functionCall":{"name":"f","args":{"x":1}}}]},{"role":"user","parts":[{"functionResponse":{"name":"f","response":{"y":2}}}]}]}`, 27 + 31, 0, 0},
	{"gemini executableCode and codeExecutionResult as compact JSON", geminiPath,
		`{"contents":[{"role":"model","parts":[{"executableCode":{"language":"PYTHON","code":"print(1)"}},{"codeExecutionResult":{"outcome":"OUTCOME_OK","output":"1"}}]}]}`, 39 + 37, 0, 0},
	{"gemini systemInstruction", geminiPath, `{"systemInstruction":{"parts":[{"text":"Be kind."}]},"contents":[]}`, 8, 0, 0},
	{"gemini system_instruction (snake_case)", geminiPath, `{"system_instruction":{"parts":[{"text":"Be kind."}]}}`, 8, 0, 0},
	{"gemini tools as compact JSON", geminiPath,
		`{"contents":[],"tools":[{"functionDeclarations":[{"name":"f","description":"d","parameters":{"type":"OBJECT"}}]}]}`, 88, 0, 0},
	{"gemini countTokens generateContentRequest", "/v1beta/models/gemini-2.5-flash:countTokens",
		`{"generateContentRequest":{"model":"models/gemini-2.5-flash","contents":[{"parts":[{"text":"abcd"}]}],"systemInstruction":{"parts":[{"text":"ef"}]}}}`, 6, 0, 0},

	// Bedrock Converse: content blocks are unions, each named by its member.
	{"converse text blocks, system blocks, a cache point counts nothing", conversePath,
		`{"system":[{"text":"Be terse."},{"cachePoint":{"type":"default"}}],"messages":[{"role":"user","content":[{"text":"Hello"},{"text":", world"}]}],"inferenceConfig":{"maxTokens":512,"temperature":0.5}}`,
		9 + 5 + 7, 0, 0},
	{"converse image, document and video blocks are media", conversePath,
		`{"messages":[{"role":"user","content":[{"image":{"format":"png","source":{"bytes":"iVBORw0KGgo="}}},{"document":{"format":"pdf","name":"a","source":{"bytes":"JVBERi0="}}},{"video":{"format":"mp4","source":{"s3Location":{"uri":"s3://b/v.mp4"}}}},{"text":"What?"}]}]}`,
		5, 0, 3},
	{"converse toolUse name and input as compact JSON, toolResult its blocks", conversePath,
		`{"messages":[{"role":"assistant","content":[{"toolUse":{"toolUseId":"t1","name":"get_weather","input":{"city":"Paris"}}}]},{"role":"user","content":[{"toolResult":{"toolUseId":"t1","content":[{"text":"Sunny"},{"json":{"temp":21}},{"image":{"format":"png","source":{"bytes":"AA=="}}}],"status":"success"}}]}]}`,
		11 + 16 + 5 + 11, 0, 1},
	{"converse guardContent text is sent to the model; reasoning counts nothing", conversePath,
		`{"messages":[{"role":"user","content":[{"guardContent":{"text":{"text":"Guard me","qualifiers":["guard_content"]}}},{"reasoningContent":{"reasoningText":{"text":"hmm"}}}]}]}`,
		8, 0, 0},
	{"converse toolConfig as compact JSON", conversePath,
		`{"messages":[],"toolConfig":{"tools":[{"toolSpec":{"name":"f","inputSchema":{"json":{}}}}]}}`, 63, 0, 0},

	// Bedrock InvokeModel: the model's own body.
	{"invoke Anthropic's body", invokePath,
		`{"anthropic_version":"bedrock-2023-05-31","max_tokens":100,"system":"Be terse.","messages":[{"role":"user","content":[{"type":"text","text":"Hello"}]}]}`,
		9 + 5, 0, 0},
	{"invoke Meta's prompt", invokePath, `{"prompt":"<|begin_of_text|>Hi","max_gen_len":64,"temperature":0.5}`, 19, 0, 0},
	{"invoke Titan's inputText", invokePath, `{"inputText":"Hello","textGenerationConfig":{"maxTokenCount":64}}`, 5, 0, 0},

	// Cohere v2 chat: chat's messages, with a tool plan, and documents.
	{"cohere messages, tool calls, tool plan, tools and documents as JSON", coherePath,
		`{"model":"command-a-03-2025","messages":[{"role":"user","content":"Weather?"},{"role":"assistant","tool_plan":"Look it up.","tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c1","content":[{"type":"text","text":"Sunny"}]}],"tools":[{"type":"function","function":{"name":"get_weather","parameters":{}}}],"documents":[{"id":"d1","data":{"text":"abc"}}]}`,
		8 + 11 + 11 + 2 + 5 + 69 + 33, 0, 0},
	{"cohere document part counts its document as JSON, image_url is media", coherePath,
		`{"messages":[{"role":"tool","tool_call_id":"c1","content":[{"type":"document","document":{"id":"r","data":{"temp":"21"}}}]},{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}`,
		31, 0, 1},
}

func TestEachAPIsInputIsReadFromItsOwnFields(t *testing.T) {
	for _, c := range inputCases {
		t.Run(c.name, func(t *testing.T) {
			r, ok := read(llmapi.Of(c.path), []byte(c.body), false)
			if !ok {
				t.Fatalf("read(%q) is not known", c.path)
			}
			want := tally{chars: c.chars, tokens: c.tokens, media: c.media}
			if r.tally != want {
				t.Errorf("read = %+v, want %+v", r.tally, want)
			}
			in := (c.chars+3)/4 + c.tokens + c.media*MediaTokens
			if e := ofPath(c.path, []byte(c.body)); e.Input != in || !e.Known {
				t.Errorf("Of = %+v, want Input %d", e, in)
			}
		})
	}
}

func TestInputIsCharactersOverFourRoundedUpPlusTokenIDsPlusMedia(t *testing.T) {
	for _, c := range []struct {
		body string
		want int64
	}{
		{`{"messages":[]}`, 0},
		{`{"messages":[{"role":"user","content":"a"}]}`, 1},
		{`{"messages":[{"role":"user","content":"abcd"}]}`, 1},
		{`{"messages":[{"role":"user","content":"abcde"}]}`, 2},
		// The characters of all the text are summed before they are divided.
		{`{"messages":[{"role":"user","content":"ab"},{"role":"user","content":"cd"}]}`, 1},
		{`{"messages":[{"role":"user","content":[{"type":"text","text":"abcde"},{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}]}]}`, 2 + MediaTokens},
	} {
		if e := ofPath(chatPath, []byte(c.body)); e.Input != c.want {
			t.Errorf("%s: Input %d, want %d", c.body, e.Input, c.want)
		}
	}
	if e := ofPath(completionsPath, []byte(`{"prompt":[1,2,3,4,5]}`)); e.Input != 5 {
		t.Errorf("five token ids: Input %d, want 5", e.Input)
	}
}

func TestCharactersAreRunesNotBytes(t *testing.T) {
	for _, c := range []struct {
		text  string // a JSON string literal's contents
		chars int64
	}{
		{`héllo`, 5},        // é is two bytes
		{`日本語`, 3},          // three bytes each
		{`😀`, 1},            // four bytes
		{`h\u00e9llo`, 5},   // an escape is one character
		{`\ud83d\ude00`, 1}, // so is a surrogate pair
		{`\ud83d`, 1},       // a lone surrogate decodes to U+FFFD
		{`\ud83d\ud83d\ude00`, 2},
		{`\ude00\ud83d`, 2},
		{`a\nb\t\"\\\/`, 7},
		{"\xff\xfeab", 4}, // each invalid byte is one U+FFFD
	} {
		body := `{"messages":[{"role":"user","content":"` + c.text + `"}]}`
		r, ok := read(llmapi.Of(chatPath), []byte(body), false)
		if !ok || r.chars != c.chars {
			t.Errorf("%q: %d characters (known %v), want %d", c.text, r.chars, ok, c.chars)
		}
		var s string
		if err := json.Unmarshal([]byte(`"`+c.text+`"`), &s); err != nil || int64(len([]rune(s))) != c.chars {
			t.Errorf("%q: encoding/json decodes %d characters, the test wants %d", c.text, len([]rune(s)), c.chars)
		}
	}
}

func TestToolDefinitionsCountAsCompactJSON(t *testing.T) {
	compact := `{"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"x":{"type":"number","minimum":-1.5e3}},"required":["x"]}}}]}`
	pretty := "{\n  \"tools\": [\n    {\n      \"type\": \"function\",\n      \"function\": {\n        \"name\": \"f\",\n        \"parameters\": {\n          \"type\": \"object\",\n          \"properties\": { \"x\": { \"type\": \"number\", \"minimum\": -1.5e3 } },\n          \"required\": [ \"x\" ]\n        }\n      }\n    }\n  ]\n}\n"
	// The tool's own JSON, as compact JSON (-1.5e3 as written): 145 characters.
	const want = 145
	for _, body := range []string{compact, pretty} {
		if r, _ := read(llmapi.Of(chatPath), []byte(body), false); r.chars != want {
			t.Errorf("%d characters, want %d:\n%s", r.chars, want, body)
		}
	}
	// A string in a definition counts as decoded: \u00e9 is é.
	escaped := `{"tools":[{"d":"caf\u00e9"}]}`
	if r, _ := read(llmapi.Of(chatPath), []byte(escaped), false); r.chars != int64(len(`{"d":"café"}`)-1) {
		t.Errorf("escaped: %d characters, want %d", r.chars, len(`{"d":"café"}`)-1)
	}
}

// outputCase is a body and the output cap it sets itself.
type outputCase struct {
	name, path, body string
	output           int64
	capped           bool
}

// outputCases have one case for each output field and multiplier of each
// API, and for the APIs capped at 0.
var outputCases = []outputCase{
	{"chat max_completion_tokens", chatPath, `{"messages":[],"max_completion_tokens":300}`, 300, true},
	{"chat max_tokens", chatPath, `{"messages":[],"max_tokens":200}`, 200, true},
	{"chat with both caps has none it can trust", chatPath, `{"max_tokens":200,"max_completion_tokens":300}`, 0, false},
	{"chat max_tokens when max_completion_tokens is null", chatPath, `{"max_completion_tokens":null,"max_tokens":200}`, 200, true},
	{"chat times n", chatPath, `{"max_tokens":200,"n":3}`, 600, true},
	{"chat n alone is no cap", chatPath, `{"messages":[],"n":3}`, 0, false},
	{"completions max_tokens", completionsPath, `{"prompt":"x","max_tokens":50}`, 50, true},
	{"completions times n", completionsPath, `{"prompt":"x","max_tokens":50,"n":2}`, 100, true},
	{"completions times best_of", completionsPath, `{"prompt":"x","max_tokens":50,"best_of":4}`, 200, true},
	{"completions times the larger of n and best_of", completionsPath, `{"prompt":"x","max_tokens":50,"n":3,"best_of":2}`, 150, true},
	{"completions without max_tokens is no cap (not OpenAI's default of 16)", completionsPath, `{"prompt":"x","n":2}`, 0, false},
	{"responses max_output_tokens", responsesPath, `{"input":"x","max_output_tokens":500}`, 500, true},
	{"responses reads no other API's field", responsesPath, `{"input":"x","max_tokens":10,"max_completion_tokens":10}`, 0, false},
	{"messages max_tokens", messagesPath, `{"max_tokens":1024,"messages":[]}`, 1024, true},
	{"messages on Vertex AI max_tokens", vertexClaude, `{"anthropic_version":"vertex-2023-10-16","max_tokens":1000,"messages":[]}`, 1000, true},
	{"gemini generationConfig.maxOutputTokens", geminiPath, `{"contents":[],"generationConfig":{"maxOutputTokens":256,"temperature":0.2}}`, 256, true},
	{"gemini times generationConfig.candidateCount", geminiPath, `{"generationConfig":{"maxOutputTokens":256,"candidateCount":2}}`, 512, true},
	{"gemini generation_config.max_output_tokens times candidate_count (snake_case)", geminiPath, `{"generation_config":{"max_output_tokens":64,"candidate_count":2}}`, 128, true},
	{"gemini streamGenerateContent", "/v1beta/models/gemini-2.5-pro:streamGenerateContent", `{"generationConfig":{"maxOutputTokens":8}}`, 8, true},
	{"gemini candidateCount alone is no cap", geminiPath, `{"generationConfig":{"candidateCount":2}}`, 0, false},
	{"embeddings capped at 0", embeddingsPath, `{"input":"x"}`, 0, true},
	{"messages count_tokens capped at 0, whatever max_tokens says", "/v1/messages/count_tokens", `{"max_tokens":100,"messages":[]}`, 0, true},
	{"messages count-tokens on Vertex AI capped at 0", "/v1/projects/p/locations/l/publishers/anthropic/models/count-tokens:rawPredict", `{"max_tokens":100,"messages":[]}`, 0, true},
	{"gemini countTokens capped at 0", "/v1beta/models/gemini-2.5-flash:countTokens", `{"generationConfig":{"maxOutputTokens":64}}`, 0, true},
	{"converse inferenceConfig.maxTokens", conversePath, `{"messages":[],"inferenceConfig":{"maxTokens":512}}`, 512, true},
	{"converse maxTokens under another spelling is no cap", conversePath, `{"inferenceConfig":{"maxTokens":512,"MaxTokens":5}}`, 0, false},
	{"converse without inferenceConfig", conversePath, `{"messages":[]}`, 0, false},
	{"invoke max_tokens", invokePath, `{"anthropic_version":"bedrock-2023-05-31","max_tokens":100}`, 100, true},
	{"invoke max_gen_len", invokePath, `{"prompt":"x","max_gen_len":64}`, 64, true},
	{"invoke both caps: none it can trust", invokePath, `{"max_tokens":100,"max_gen_len":64}`, 0, false},
	{"invoke Titan's textGenerationConfig.maxTokenCount", invokePath, `{"inputText":"x","textGenerationConfig":{"maxTokenCount":300,"topP":0.9}}`, 300, true},
	{"invoke Titan's cap beside another: none it can trust", invokePath, `{"max_gen_len":64,"textGenerationConfig":{"maxTokenCount":300}}`, 0, false},
	{"invoke Titan's cap under another spelling is no cap", invokePath, `{"textGenerationConfig":{"maxTokenCount":300,"MaxTokenCount":3}}`, 0, false},
	{"invoke reads no Converse cap", invokePath, `{"inferenceConfig":{"maxTokens":512,"max_new_tokens":512}}`, 0, false},
	{"cohere max_tokens", coherePath, `{"model":"command-a-03-2025","messages":[],"max_tokens":300}`, 300, true},
	{"cohere reads no other API's field", coherePath, `{"max_completion_tokens":300,"maxTokens":300}`, 0, false},
	{"converse reads no top-level cap", conversePath, `{"max_tokens":300,"maxTokens":300}`, 0, false},
	{"responses input_tokens capped at 0", "/v1/responses/input_tokens", `{"input":"x","max_output_tokens":500}`, 0, true},
}

func TestEachAPIsOutputCapIsReadFromItsOwnField(t *testing.T) {
	for _, c := range outputCases {
		t.Run(c.name, func(t *testing.T) {
			e := ofPath(c.path, []byte(c.body))
			if !e.Known || e.Capped != c.capped || e.Output != c.output {
				t.Errorf("Of = %+v, want Output %d Capped %v", e, c.output, c.capped)
			}
		})
	}
}

// The choices a request asks for (n, the larger of n and best_of, Gemini's
// candidateCount) are read whether it names an output cap or not: a request
// without one is reserved the default for each choice.
func TestTheChoicesARequestAsksForAreReadWithOrWithoutAnOutputCap(t *testing.T) {
	for _, c := range []struct {
		path, body string
		choices    int64
	}{
		{chatPath, `{"messages":[],"n":8}`, 8},
		{chatPath, `{"messages":[],"max_tokens":10,"n":8}`, 8},
		{chatPath, `{"messages":[]}`, 1},
		{chatPath, `{"messages":[],"n":0}`, 1},
		{chatPath, `{"messages":[],"n":"8"}`, 1},
		{completionsPath, `{"prompt":"x","n":2,"best_of":5}`, 5},
		{completionsPath, `{"prompt":"x","n":3}`, 3},
		{responsesPath, `{"input":"x","n":4}`, 1},
		{messagesPath, `{"messages":[],"n":4}`, 1},
		{geminiPath, `{"generationConfig":{"candidateCount":3}}`, 3},
		{geminiPath, `{"generation_config":{"candidate_count":2}}`, 2},
		{chatPath, `{"n":1099511627777}`, 1 << 40},
	} {
		if e := ofPath(c.path, []byte(c.body)); !e.Known || e.Choices != c.choices {
			t.Errorf("%s %s: %+v, want Choices %d", c.path, c.body, e, c.choices)
		}
	}
	// A body cut short counts the choices it names before the cut.
	if e := OfPrefix(llmapi.Of(chatPath), []byte(`{"n":8,"messages":[{"content":"abc`)); e.Choices != 8 || e.Capped {
		t.Errorf("a prefix naming n 8: %+v, want Choices 8 and no cap", e)
	}
}

func TestACapThatIsNotAPositiveIntegerIsNoCap(t *testing.T) {
	for _, v := range []string{`0`, `-5`, `-0`, `1.5`, `100.01`, `1e3`, `1E3`, `"100"`, `null`, `true`, `[100]`, `{"n":100}`} {
		for _, c := range []struct{ path, body string }{
			{chatPath, `{"max_tokens":` + v + `}`},
			{chatPath, `{"max_completion_tokens":` + v + `}`},
			{completionsPath, `{"max_tokens":` + v + `}`},
			{responsesPath, `{"max_output_tokens":` + v + `}`},
			{messagesPath, `{"max_tokens":` + v + `}`},
			{geminiPath, `{"generationConfig":{"maxOutputTokens":` + v + `}}`},
			{conversePath, `{"inferenceConfig":{"maxTokens":` + v + `}}`},
			{invokePath, `{"max_tokens":` + v + `}`},
			{invokePath, `{"max_gen_len":` + v + `}`},
			{invokePath, `{"textGenerationConfig":{"maxTokenCount":` + v + `}}`},
			{coherePath, `{"max_tokens":` + v + `}`},
		} {
			if e := ofPath(c.path, []byte(c.body)); !e.Known || e.Capped || e.Output != 0 {
				t.Errorf("%s %s: %+v, want known and not capped", c.path, c.body, e)
			}
		}
		// A multiplier given as something else than a count (an upstream
		// may read "8" or 1e1 as one) leaves the output unknown: no cap. A
		// null one is no multiplier.
		for _, c := range []struct{ path, body string }{
			{chatPath, `{"max_tokens":10,"n":` + v + `}`},
			{completionsPath, `{"max_tokens":10,"n":` + v + `}`},
			{completionsPath, `{"max_tokens":10,"best_of":` + v + `}`},
			{geminiPath, `{"generationConfig":{"maxOutputTokens":10,"candidateCount":` + v + `}}`},
		} {
			if e := ofPath(c.path, []byte(c.body)); v == `null` && (!e.Capped || e.Output != 10) || v != `null` && (e.Capped || e.Choices != 1) {
				t.Errorf("%s %s: %+v, want Output 10 for a null multiplier and no cap, one choice for any other", c.path, c.body, e)
			}
		}
	}
	// A whole number written with a fraction of zeros is a count.
	if e := ofPath(chatPath, []byte(`{"max_tokens":256.0,"n":2.00}`)); !e.Capped || e.Output != 512 {
		t.Errorf("256.0 × 2.00: %+v, want Output 512", e)
	}
}

func TestCountsSaturateAt2To40(t *testing.T) {
	for _, c := range []struct{ path, body string }{
		{chatPath, `{"max_tokens":1099511627777}`},
		{chatPath, `{"max_tokens":99999999999999999999999999999999999999}`},
		{chatPath, `{"max_tokens":1048576,"n":1048577}`},
		{chatPath, `{"max_tokens":1099511627776,"n":1099511627776}`},
		{completionsPath, `{"max_tokens":99999999999999999999,"best_of":99999999999999999999}`},
		{geminiPath, `{"generationConfig":{"maxOutputTokens":4294967296,"candidateCount":4294967296}}`},
	} {
		if e := ofPath(c.path, []byte(c.body)); e.Output != 1<<40 {
			t.Errorf("%s: Output %d, want 1<<40", c.body, e.Output)
		}
	}
	if e := ofPath(chatPath, []byte(`{"max_tokens":1048576,"n":1048576}`)); e.Output != 1<<40 {
		t.Errorf("2^20 × 2^20: Output %d, want exactly 1<<40", e.Output)
	}
	if mul(limit, MediaTokens) != limit || mul(limit/MediaTokens, MediaTokens) > limit || mul(0, limit) != 0 {
		t.Error("mul does not saturate at limit")
	}
}

// bigBase64 is n bytes of base64 text.
func bigBase64(n int) string {
	return strings.Repeat("iVBORw0KGgoAAAANSUhEUgAAB4AAAAQ4CAIAAABnsVYUAAAAA3NCSVQICAjb4U/g", n/64+1)[:n]
}

func TestMediaCountsAFixedEstimateNotItsBytes(t *testing.T) {
	data := bigBase64(2 << 20)
	for _, c := range []struct{ name, path, body string }{
		{"chat image_url data URL", chatPath,
			`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,` + data + `"}}]}]}`},
		{"chat input_audio", chatPath,
			`{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"` + data + `","format":"wav"}}]}]}`},
		{"chat file", chatPath,
			`{"messages":[{"role":"user","content":[{"type":"file","file":{"filename":"a.pdf","file_data":"data:application/pdf;base64,` + data + `"}}]}]}`},
		{"responses input_image", responsesPath,
			`{"input":[{"role":"user","content":[{"type":"input_image","image_url":"data:image/png;base64,` + data + `"}]}]}`},
		{"responses input_file", responsesPath,
			`{"input":[{"role":"user","content":[{"type":"input_file","filename":"a.pdf","file_data":"data:application/pdf;base64,` + data + `"}]}]}`},
		{"messages image", messagesPath,
			`{"max_tokens":1,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + data + `"}}]}]}`},
		{"messages document", messagesPath,
			`{"max_tokens":1,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"` + data + `"}}]}]}`},
		{"messages image in a tool_result", messagesPath,
			`{"max_tokens":1,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"source":{"data":"` + data + `","type":"base64","media_type":"image/png"},"type":"image"}]}]}]}`},
		{"gemini inlineData", geminiPath,
			`{"contents":[{"parts":[{"inlineData":{"mimeType":"image/png","data":"` + data + `"}}]}]}`},
		{"gemini inline_data", geminiPath,
			`{"contents":[{"parts":[{"inline_data":{"mime_type":"audio/wav","data":"` + data + `"}}]}]}`},
		{"converse image", conversePath,
			`{"messages":[{"role":"user","content":[{"image":{"format":"png","source":{"bytes":"` + data + `"}}}]}]}`},
		{"converse document in a toolResult", conversePath,
			`{"messages":[{"role":"user","content":[{"toolResult":{"toolUseId":"t","content":[{"document":{"format":"pdf","name":"a","source":{"bytes":"` + data + `"}}}]}}]}]}`},
		{"converse video", conversePath,
			`{"messages":[{"role":"user","content":[{"video":{"format":"mp4","source":{"bytes":"` + data + `"}}}]}]}`},
		{"invoke Anthropic image", invokePath,
			`{"anthropic_version":"bedrock-2023-05-31","max_tokens":1,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + data + `"}}]}]}`},
		{"cohere image_url", coherePath,
			`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,` + data + `"}}]}]}`},
	} {
		if e := ofPath(c.path, []byte(c.body)); !e.Known || e.Input != MediaTokens {
			t.Errorf("%s: %+v, want Input %d", c.name, e, MediaTokens)
		}
	}
}

func TestPartsOfOtherTypesCountNothing(t *testing.T) {
	for _, c := range []struct{ name, path, body string }{
		{"messages thinking and redacted_thinking", messagesPath,
			`{"messages":[{"role":"assistant","content":[{"type":"thinking","thinking":"long thoughts","signature":"EqQBCgIYAhIM"},{"type":"redacted_thinking","data":"EmwKAhgBEgy3"}]}]}`},
		{"responses reasoning and item_reference", responsesPath,
			`{"input":[{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"Thought"}],"encrypted_content":"gAAAAABo"},{"type":"item_reference","id":"msg_1"}]}`},
		{"chat part without a type", chatPath,
			`{"messages":[{"role":"user","content":[{"text":"no type"}]}]}`},
		{"content that is neither a string nor an array", chatPath,
			`{"messages":[{"role":"user","content":{"text":"an object"}},{"role":"user","content":42}]}`},
		{"members no API counts", chatPath,
			`{"model":"gpt-4o","temperature":0.5,"response_format":{"type":"json_object"},"metadata":{"k":"long value"},"user":"u"}`},
	} {
		if r, ok := read(llmapi.Of(c.path), []byte(c.body), false); !ok || r.tally != (tally{}) {
			t.Errorf("%s: %+v (known %v), want nothing counted", c.name, r.tally, ok)
		}
	}
}

func TestAMemberGivenTwiceCountsItsLastValue(t *testing.T) {
	for _, c := range []struct {
		path, body string
		chars      int64
		output     int64
	}{
		{chatPath, `{"messages":[{"role":"user","content":"abcdefgh"}],"messages":[{"role":"user","content":"ab"}]}`, 2, 0},
		{chatPath, `{"max_tokens":100,"max_tokens":7}`, 0, 7},
		{chatPath, `{"messages":[{"role":"user","content":"abcdefgh","content":"ab"}]}`, 2, 0},
		{chatPath, `{"messages":[{"role":"user","content":[{"type":"image_url","type":"text","text":"abc"}]}]}`, 3, 0},
		{chatPath, `{"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"abcdefgh"}}],"tool_calls":[{"function":{"name":"ab"}}]}]}`, 2, 0},
		{messagesPath, `{"max_tokens":5,"system":"abcdefgh","system":"a"}`, 1, 5},
		{geminiPath, `{"contents":[{"parts":[{"text":"abcdefgh","text":"abc"}]}],"generationConfig":{"maxOutputTokens":9,"maxOutputTokens":3}}`, 3, 3},
	} {
		r, ok := read(llmapi.Of(c.path), []byte(c.body), false)
		if !ok || r.chars != c.chars || r.out != c.output {
			t.Errorf("%s: %d characters, output %d (known %v); want %d, %d", c.body, r.chars, r.out, ok, c.chars, c.output)
		}
	}
}

// Gemini's fields are read under both their spellings, camelCase and
// snake_case, as protobuf's JSON reads them: text under both counts, and a
// count given under two of them is no cap this package can trust.
func TestGeminiReadsBothSpellingsAndTrustsNoCountGivenUnderTwo(t *testing.T) {
	body := `{"generation_config":{"maxOutputTokens":7},"generationConfig":{"max_output_tokens":5,"candidate_count":2,"candidateCount":3},` +
		`"systemInstruction":{"parts":[{"text":"ab"}]},"system_instruction":{"parts":[{"text":"cd"}]}}`
	e := ofPath(geminiPath, []byte(body))
	if r, _ := read(llmapi.Of(geminiPath), []byte(body), false); r.chars != 4 || e.Capped {
		t.Errorf("%d characters, %+v; want 4 (both instructions), and no cap", r.chars, e)
	}
	body = `{"generation_config":{"max_output_tokens":7,"candidate_count":2}}`
	if e := ofPath(geminiPath, []byte(body)); !e.Capped || e.Output != 14 {
		t.Errorf("snake_case alone: %+v, want Output 14", e)
	}
}

// A cap or a multiplier given under two spellings of its key, which an
// upstream decoding JSON into a Go struct matches without regard to case
// (and, as encoding/json folds them, the Kelvin sign as a k and the long s
// as an s), reading the last, is not one this package can be sure of: the
// request is not capped, so that no ceiling of a cap the upstream did not
// read bounds what it is charged.
func TestACountGivenUnderAnotherSpellingOfItsKeyIsNoCap(t *testing.T) {
	for _, c := range []struct{ path, body string }{
		{chatPath, `{"max_tokens":10,"MAX_TOKENS":4096}`},
		{chatPath, `{"Max_Tokens":4096,"max_tokens":10}`},
		{chatPath, `{"max_completion_tokens":10,"max_completion_Tokens":4096}`},
		{chatPath, `{"max_tokens":10,"N":8}`},
		{chatPath, `{"max_tokens":10,"max_to\u212Aens":4096}`},     // escaped
		{chatPath, "{\"max_tokens\":10,\"max_to\u212Aens\":4096}"}, // in UTF-8
		{chatPath, "{\"max_tokens\":10,\"max_token\u017f\":4096}"},
		{completionsPath, `{"max_tokens":10,"Best_Of":8}`},
		{"/v1/responses", `{"max_output_tokens":10,"MAX_OUTPUT_TOKENS":4096}`},
		{"/v1/messages", `{"max_tokens":10,"max_Tokens":4096}`},
		{geminiPath, `{"generationConfig":{"maxOutputTokens":10,"maxoutputtokens":4096}}`},
		{geminiPath, `{"generationConfig":{"maxOutputTokens":10,"CandidateCount":8}}`},
		{geminiPath, `{"generationConfig":{"maxOutputTokens":10},"GenerationConfig":{"maxOutputTokens":4096}}`},
		{geminiPath, `{"generationConfig":{"maxOutputTokens":10},"generationconfig":{}}`},
		{conversePath, `{"inferenceConfig":{"maxTokens":10},"InferenceConfig":{"maxTokens":4096}}`},
		{conversePath, `{"inferenceConfig":{"maxTokens":10,"maxtokens":4096}}`},
		{invokePath, `{"max_tokens":10,"Max_Tokens":4096}`},
		{invokePath, `{"max_gen_len":10,"MAX_GEN_LEN":4096}`},
		{invokePath, `{"textGenerationConfig":{"maxTokenCount":10},"textgenerationconfig":{"maxTokenCount":4096}}`},
		{coherePath, `{"max_tokens":10,"MAX_TOKENS":4096}`},
	} {
		if e := ofPath(c.path, []byte(c.body)); !e.Known || e.Capped {
			t.Errorf("%s %s: %+v, want a request that names no cap", c.path, c.body, e)
		}
	}
	for _, c := range []struct{ path, body string }{
		{chatPath, `{"max_tokens":10,"metadata":{"MAX_TOKENS":4096}}`},
		{chatPath, `{"max_tokens":10,"max_tokens2":4096,"max_token":1}`},
		{chatPath, `{"max_tokens":10,"max_tokens":10}`},
	} {
		if e := ofPath(c.path, []byte(c.body)); !e.Capped || e.Output != 10 {
			t.Errorf("%s %s: %+v, want Output 10", c.path, c.body, e)
		}
	}
}

func TestEscapedKeysAreReadAsTheProviderDecodesThem(t *testing.T) {
	body := `{"m\u0065ssages":[{"role":"user","\u0063ontent":"abcdefgh"}],"max_\u0074okens":64}`
	if e := ofPath(chatPath, []byte(body)); e.Input != 2 || e.Output != 64 {
		t.Errorf("%+v, want Input 2 and Output 64", e)
	}
	// Keys are compared exactly: no API spells these so.
	body = `{"Messages":[{"role":"user","content":"abcdefgh"}],"MAX_TOKENS":64,"max_tokens ":64}`
	if e := ofPath(chatPath, []byte(body)); !e.Known || e.Input != 0 || e.Capped {
		t.Errorf("%+v, want nothing read", e)
	}
}

func TestBadJSONIsUnknownNotAnError(t *testing.T) {
	for _, body := range []string{
		``, ` `, `null`, `[]`, `"messages"`, `42`, `[{"messages":[]}]`,
		`{`, `{"messages":[{"role":"user","content":"abc"}]`, `{"messages":[{"role":"user","content":"abc}]}`,
		`{"messages":[]}}`, `{"messages":[]} x`, `{"messages":[]}{}`, `{"messages":[],}`, `{"messages":[1,]}`,
		`{"messages" []}`, `{messages:[]}`, `{'messages':[]}`, `{"max_tokens":01}`, `{"max_tokens":1.}`, `{"max_tokens":-}`,
		`{"max_tokens":+1}`, `{"max_tokens":.5}`, `{"max_tokens":1e}`, `{"n":tru}`, `{"n":nul}`, `{"a":"\x"}`, `{"a":"\u12"}`,
		"{\"a\":\"tab\there\"}", `{"a":"` + "\x00" + `"}`, "\xef\xbb\xbf{}", `{"a":NaN}`, `{"a":Infinity}`,
		strings.Repeat(`{"a":`, 10001) + `1` + strings.Repeat(`}`, 10001),
		`{"messages":` + strings.Repeat(`[`, 10000) + strings.Repeat(`]`, 10000) + `}`,
	} {
		for _, path := range apiPaths {
			if e := ofPath(path, []byte(body)); e != (Estimate{}) {
				t.Errorf("%s %.40q: %+v, want the zero Estimate", path, body, e)
			}
		}
	}
}

func TestValidityIsEncodingJSONs(t *testing.T) {
	for _, v := range []string{
		`0`, `-0`, `-0.0e+0`, `1E-7`, `123456789012345678901234567890`, `true`, `false`, `null`, `""`, `"\/\b\f\n\r\t\"\\"`,
		`"\uD83D\uDE00"`, `"\uZZZZ"`, "\"\x7f\xff\"", `[]`, `{}`, `[[],{}]`, `{"":{"":[]}}`, ` [ 1 , 2 ] `, `[1 2]`, `{"a" "b"}`,
		`{"a":}`, `{,}`, `[,]`, `01`, `1.e1`, `1e+`, `-`, `--1`, `"`, `"\`, `[`, `]`, `{"a":1,"a":2}`,
		strings.Repeat(`[`, 9999) + strings.Repeat(`]`, 9999),
		strings.Repeat(`[`, 10000) + strings.Repeat(`]`, 10000),
		strings.Repeat(`[`, 10001) + strings.Repeat(`]`, 10001),
	} {
		body := `{"tools":[` + v + `]}`
		if e := ofPath(chatPath, []byte(body)); e.Known != json.Valid([]byte(body)) {
			t.Errorf("%.60q: Known %v, json.Valid %v", body, e.Known, json.Valid([]byte(body)))
		}
	}
}

func TestOtherPathsAreUnknown(t *testing.T) {
	body := []byte(`{"messages":[{"role":"user","content":"abcd"}],"max_tokens":10}`)
	for _, path := range []string{
		"", "/", "/v1/models", "/v1/chat", "/v1/chat/completions/chatcmpl-123", "/v1/threads/thread_1/messages",
		"/v1/messages/batches", "/v1/responses/resp_1", "/v1/responses/resp_1/cancel", "/v1/images/generations",
		"/v1beta/models/gemini-2.5-flash:embedContent", "/v1beta/models/gemini-2.5-flash", "/v1/projects/p/locations/l/publishers/google/models/m:rawPredict",
		"/v1/CHAT/COMPLETIONS", "/v1/messages.json",
	} {
		if e := ofPath(path, body); e != (Estimate{}) {
			t.Errorf("ofPath(%q) = %+v, want the zero Estimate", path, e)
		}
	}
}

func TestOfAllocatesNothing(t *testing.T) {
	for _, c := range []struct {
		name, path string
		body       []byte
	}{
		{"chat", chatPath, []byte(typicalChat)},
		{"image", chatPath, imageChat(1 << 20)},
		{"converse", conversePath, []byte(converseBody)},
		{"invoke", invokePath, []byte(invokeBody)},
		{"cohere", coherePath, []byte(cohereBody)},
	} {
		call := llmapi.Of(c.path)
		if n := testing.AllocsPerRun(20, func() { Of(call, c.body) }); n != 0 {
			t.Errorf("%s: %v allocations a call", c.name, n)
		}
		if n := testing.AllocsPerRun(20, func() { OfPrefix(call, c.body[:len(c.body)/2]) }); n != 0 {
			t.Errorf("%s: %v allocations a call of OfPrefix", c.name, n)
		}
	}
}

// typicalChat is a chat completions request of about 2 KB: a system prompt,
// a few turns, a tool and a tool call.
const typicalChat = `{
  "model": "gpt-4o-mini",
  "temperature": 0.3,
  "max_completion_tokens": 800,
  "stream": true,
  "stream_options": {"include_usage": true},
  "messages": [
    {"role": "system", "content": "You are a support assistant for an online bookshop. Answer in at most three sentences, cite the order number when there is one, and never promise a refund: hand refunds to a human by calling the escalate tool. Prices are in euros."},
    {"role": "user", "content": "Hi! I ordered two books last week (order 58213) and only one arrived. The parcel looked fine. What should I do?"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_Xq2", "type": "function", "function": {"name": "lookup_order", "arguments": "{\"order_id\":\"58213\"}"}}]},
    {"role": "tool", "tool_call_id": "call_Xq2", "content": "{\"order_id\":\"58213\",\"items\":[{\"title\":\"The Left Hand of Darkness\",\"status\":\"delivered\"},{\"title\":\"A Wizard of Earthsea\",\"status\":\"shipped separately\",\"eta\":\"2 days\"}]}"},
    {"role": "assistant", "content": "Order 58213 was sent in two parcels: The Left Hand of Darkness has arrived, and A Wizard of Earthsea is on its way separately, due in about two days."},
    {"role": "user", "content": "Oh, good. And if it does not arrive by Friday, can I get my money back?"}
  ],
  "tools": [
    {"type": "function", "function": {"name": "lookup_order", "description": "Look up an order by its number.", "parameters": {"type": "object", "properties": {"order_id": {"type": "string", "description": "The order number."}}, "required": ["order_id"]}}},
    {"type": "function", "function": {"name": "escalate", "description": "Hand the conversation to a human agent, with a short summary.", "parameters": {"type": "object", "properties": {"summary": {"type": "string"}, "priority": {"type": "string", "enum": ["low", "normal", "high"]}}, "required": ["summary"]}}}
  ]
}`

// imageChat is a chat completions request with a short question and an image
// of n bytes of base64 in a data URL.
func imageChat(n int) []byte {
	return []byte(`{"model":"gpt-4o","max_tokens":300,"messages":[{"role":"user","content":[{"type":"text","text":"What is in this picture?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,` +
		bigBase64(n) + `","detail":"high"}}]}]}`)
}

func BenchmarkOf(b *testing.B) {
	for _, c := range []struct {
		name string
		body []byte
	}{
		{"chat-2KB", []byte(typicalChat)},
		{"image-2MB", imageChat(2 << 20)},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(c.body)))
			for b.Loop() {
				ofPath(chatPath, c.body)
			}
		})
	}
}

// A body cut short at any byte is estimated at no more than the whole and at
// no less than any shorter cut, so that a body longer than the read limit
// reserves at least what a shorter body with the same beginning would.
func TestAPrefixEstimatesNoLessThanAShorterPrefixAndTheWholeAsOf(t *testing.T) {
	bodies := map[string]string{
		"/v1/chat/completions": `{"model":"gpt-4o","messages":[{"role":"system","content":"be brief é"},{"role":"user","content":[{"type":"text","text":"what is \u00e9 in this"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}],"max_tokens":30}`,
		"/v1/messages":         `{"model":"claude","max_tokens":64,"system":"s","messages":[{"role":"user","content":[{"type":"text","text":"hello there"},{"type":"image","source":{"type":"base64","data":"AAAA"}}]}]}`,
		"/v1beta/models/gemini-2.5-flash:generateContent": `{"contents":[{"role":"user","parts":[{"text":"a long question"},{"inline_data":{"mime_type":"image/png","data":"AAAA"}}]}]}`,
		"/v1/completions": `{"model":"m","prompt":[1,2,3,4,5,6]}`,
		conversePath:      converseBody,
		invokePath:        invokeBody,
		coherePath:        cohereBody,
	}
	for path, body := range bodies {
		whole := ofPath(path, []byte(body))
		if !whole.Known {
			t.Fatalf("%s: the whole body is not read: %s", path, body)
		}
		if got := OfPrefix(llmapi.Of(path), []byte(body)); got.Input != whole.Input || got.Capped {
			t.Errorf("%s: the whole body as a prefix estimates %+v, want input %d and no cap", path, got, whole.Input)
		}
		last := int64(0)
		for k := range len(body) + 1 {
			e := OfPrefix(llmapi.Of(path), []byte(body[:k]))
			if e.Input < last || e.Input > whole.Input {
				t.Fatalf("%s cut at %d (%q): input %d, want between the shorter cut's %d and the whole's %d", path, k, body[:k], e.Input, last, whole.Input)
			}
			last = e.Input
		}
	}
}
