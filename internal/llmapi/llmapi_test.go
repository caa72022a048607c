package llmapi

import "testing"

func TestPathsAreToldByTheirEndUnderAnyPrefix(t *testing.T) {
	const vertexClaude = "/v1/projects/p/locations/l/publishers/anthropic/models/claude-sonnet-4@20250514:rawPredict"
	for _, c := range []struct {
		path string
		want Call
	}{
		{"/v1/chat/completions", Call{API: Chat}},
		{"/openai/v1/chat/completions", Call{API: Chat, Azure: true}},
		{"/openai/deployments/gpt-4o/chat/completions", Call{API: Chat, Model: "gpt-4o", Azure: true}},
		{"/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21", Call{API: Chat, Model: "gpt-4o", Azure: true}},
		{"/v1/chat/completions/", Call{API: Chat}},
		{"/openai/deployments/cheap/../dear/chat/completions", Call{API: Chat, Model: "dear", Azure: true}},
		{"/openai/deployments/dear/./chat/completions", Call{API: Chat, Model: "dear", Azure: true}},
		{"/v1beta/models/dear:generateContent/.", Call{API: Gemini, Model: "dear"}},
		{"/v1beta/models//dear:generateContent", Call{API: Gemini, Model: "dear"}},
		{"/v1beta/models/cheap:generateContent/../dear:generateContent", Call{API: Gemini, Model: "dear"}},
		{"/v1/messages/..", Call{}},
		{"/v1beta/openai/chat/completions", Call{API: Chat, Azure: true}},
		{"/v1/completions", Call{API: Completions}},
		{"/openai/deployments/instruct/completions", Call{API: Completions, Model: "instruct", Azure: true}},
		{"/v1/embeddings", Call{API: Embeddings, NoOutput: true}},
		{"/openai/deployments/ada/embeddings", Call{API: Embeddings, NoOutput: true, Model: "ada", Azure: true}},
		{"/v1/responses", Call{API: Responses}},
		{"/v1/responses/input_tokens", Call{API: Responses, NoOutput: true}},
		{"/v1/messages", Call{API: Messages}},
		{"/anthropic/messages", Call{API: Messages}},
		{"/v1/messages/count_tokens", Call{API: Messages, NoOutput: true}},
		{"/v1beta/models/gemini-2.5-flash:generateContent", Call{API: Gemini, Model: "gemini-2.5-flash"}},
		{"/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse", Call{API: Gemini, Model: "gemini-2.5-pro"}},
		{"/v1beta/models/gemini-2.5-flash:countTokens", Call{API: Gemini, NoOutput: true, Model: "gemini-2.5-flash"}},
		{"/v1beta/tunedModels/my-model:generateContent", Call{API: Gemini}},
		{"/v1/projects/p/locations/us-central1/publishers/google/models/gemini-2.5-pro:generateContent", Call{API: Gemini, Model: "gemini-2.5-pro"}},
		{vertexClaude, Call{API: Messages, Model: "claude-sonnet-4@20250514"}},
		{"/v1/projects/p/locations/l/publishers/anthropic/models/claude-sonnet-4@20250514:streamRawPredict", Call{API: Messages, Model: "claude-sonnet-4@20250514"}},
		{"/v1/projects/p/locations/l/publishers/anthropic/models/count-tokens:rawPredict", Call{API: Messages, NoOutput: true}},
		{"/v1/models/gpt-4o", Call{}},
		{"/v1/threads/thread_1/messages", Call{}},
		{"/v1/messages/batches", Call{}},
		{"/v1beta/models/gemini-embedding-001:embedContent", Call{Model: "gemini-embedding-001"}},
		{"/v1beta/models/gemini-embedding-001:batchEmbedContents", Call{Model: "gemini-embedding-001"}},
		{"/v1beta/tunedModels/m:embedContent", Call{}},
		{"/v1/projects/p/locations/l/publishers/google/models/m:rawPredict", Call{}},
		{"/v1/CHAT/COMPLETIONS", Call{}},
		{"/model/anthropic.claude-3-5-haiku-20241022-v1:0/converse", Call{API: Converse, Model: "anthropic.claude-3-5-haiku-20241022-v1:0"}},
		{"/model/us.anthropic.claude-sonnet-4-20250514-v1:0/converse-stream", Call{API: Converse, Model: "us.anthropic.claude-sonnet-4-20250514-v1:0"}},
		{"/bedrock/model/meta.llama3-70b-instruct-v1:0/invoke", Call{API: Invoke, Model: "meta.llama3-70b-instruct-v1:0"}},
		{"/model/anthropic.claude-3-haiku-20240307-v1:0/invoke-with-response-stream", Call{API: Invoke, Model: "anthropic.claude-3-haiku-20240307-v1:0"}},
		// An ARN's slashes are encoded by its clients, and decoded in the path.
		{"/model/arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-3-7-sonnet-20250219-v1:0/converse",
			Call{API: Converse, Model: "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-3-7-sonnet-20250219-v1:0"}},
		{"/model/cheap/../dear/converse", Call{API: Converse, Model: "dear"}},
		{"/openai/model/m/invoke", Call{API: Invoke, Model: "m"}},
		{"/model/converse", Call{}},
		{"/model//converse", Call{}},
		{"/v2/chat", Call{API: CohereChat}},
		{"/model/anthropic.claude-3-5-haiku-20241022-v1:0/count-tokens", Call{API: Converse, NoOutput: true, Model: "anthropic.claude-3-5-haiku-20241022-v1:0"}},
		{"/v1/messages/count-tokens", Call{}},
		{"/cohere/v2/chat", Call{API: CohereChat}},
		{"/v1/chat", Call{}},
	} {
		if got := Of(c.path); got != c.want {
			t.Errorf("Of(%q) = %+v, want %+v", c.path, got, c.want)
		}
	}
}

func TestEachAPIIsItsProvidersAndAnUnknownOneOpenAIs(t *testing.T) {
	for api, want := range map[API]Provider{Unknown: OpenAI, Chat: OpenAI, Completions: OpenAI, Embeddings: OpenAI, Responses: OpenAI, Messages: Anthropic, Gemini: Google, Converse: Bedrock, Invoke: Bedrock, CohereChat: Cohere} {
		if got := (Call{API: api}).Provider(); got != want {
			t.Errorf("API %d: provider %d, want %d", api, got, want)
		}
	}
}

// Telling a call costs no allocation when its path is clean, as nearly
// every request's is: it runs on every request.
func TestACleanPathIsToldWithoutAllocating(t *testing.T) {
	for _, path := range []string{"/v1/chat/completions", "/v1/chat/completions/", "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse", "/model/us.anthropic.claude-sonnet-4-20250514-v1:0/converse-stream"} {
		if n := testing.AllocsPerRun(20, func() { Of(path) }); n != 0 {
			t.Errorf("Of(%q): %v allocations a call", path, n)
		}
	}
}
