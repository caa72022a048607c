// Package llmapi tells which LLM API a request calls, from its URL path
// alone: the one classifier that the gateway's answers (whose SDK reads
// them), its token estimate and its model read.
//
// The API is told by the end of the path, whatever comes before it (a
// gateway's mount, Azure's /openai/deployments/<d>); anything from a '?'
// is ignored, and segments are compared exactly, once the path is read as
// a server that normalises it reads it: its dot segments ("." and "..")
// resolved, repeated slashes and a trailing one dropped. A client that
// writes /openai/deployments/cheap/../dear/… is then counted at the model
// such an upstream serves, and one that does not normalise answers 404:
//
//	…/chat/completions                      OpenAI chat completions
//	…/completions (not chat/)               OpenAI legacy completions
//	…/embeddings                            OpenAI embeddings           no output
//	…/responses                             OpenAI Responses
//	…/responses/input_tokens                its token count             no output
//	…/messages (not …/threads/<id>/messages, the Assistants API)
//	                                        Anthropic Messages
//	…/messages/count_tokens                 its token count             no output
//	…/<model>:generateContent, …/<model>:streamGenerateContent
//	                                        Gemini (and Vertex AI)
//	…/<model>:countTokens                   its token count             no output
//	…/publishers/anthropic/…/<model>:rawPredict, :streamRawPredict
//	                                        Anthropic Messages on Vertex AI
//	                                        (model count-tokens: no output)
//	…/model/<model>/converse, …/converse-stream
//	                                        Bedrock Converse
//	…/model/<model>/invoke, …/invoke-with-response-stream
//	                                        Bedrock InvokeModel
//	…/model/<model>/count-tokens            Bedrock CountTokens         no output
//	…/v2/chat                               Cohere chat
//
// A Bedrock model is everything between the path's last /model/ and its
// method, as the path is decoded: a model id, an inference profile
// (us.anthropic.claude-…), or an ARN, which its clients URL-encode whole,
// slashes included (arn:aws:bedrock:…:inference-profile/us.anthropic.…).
//
// Any other path is Unknown, and is answered as OpenAI's; of Gemini's
// …/models/<model>:embedContent and :batchEmbedContents, whose bodies this
// package does not read, the model is read all the same, so that they are
// priced as their model.
package llmapi

import (
	"path"
	"strings"
)

// API is an API a request calls.
type API uint8

const (
	Unknown API = iota
	Chat
	Completions
	Embeddings
	Responses
	Messages
	Gemini
	// Converse is Bedrock's Converse and ConverseStream: one request shape
	// for every model it serves.
	Converse
	// Invoke is Bedrock's InvokeModel and InvokeModelWithResponseStream,
	// whose bodies are the model's own (Anthropic's Messages for its
	// models).
	Invoke
	CohereChat // Cohere's v2 chat
)

// Provider is whose API it is: whose SDK reads the gateway's answers, and
// where it sends its caller's credential.
type Provider uint8

const (
	OpenAI Provider = iota // and every API this package does not know
	Anthropic
	Google
	Bedrock
	Cohere
)

// Call is what a path says of the request.
type Call struct {
	API API
	// NoOutput: the call produces no output tokens (embeddings and the
	// token-counting calls).
	NoOutput bool
	// Model is the model the path names: Gemini's and Vertex AI's
	// …/models/<model>:<method>, Azure OpenAI's deployment, Bedrock's
	// …/model/<model>/<method>; "" when only the body names it.
	Model string
	// Azure: the path is Azure OpenAI's (under /openai/), whose callers may
	// send an api-key header in place of a bearer token.
	Azure bool
}

// Provider is the provider of the call's API.
func (c Call) Provider() Provider {
	switch c.API {
	case Messages:
		return Anthropic
	case Gemini:
		return Google
	case Converse, Invoke:
		return Bedrock
	case CohereChat:
		return Cohere
	}
	return OpenAI
}

// Of is the call that a request for urlPath makes.
func Of(urlPath string) Call {
	urlPath, _, _ = strings.Cut(urlPath, "?")
	if !strings.HasPrefix(urlPath, "/") {
		urlPath = "/" + urlPath
	}
	path := path.Clean(urlPath) // a clean path, as most are, is not copied
	c := Call{Azure: strings.Contains(path, "/openai/")}
	if _, rest, ok := strings.Cut(path, "/openai/deployments/"); ok {
		c.Model, _, _ = strings.Cut(rest, "/")
	}
	rest, last := cutLast(path)
	rest, prev := cutLast(rest)
	_, prev2 := cutLast(rest)
	switch {
	case last == "completions" && prev == "chat":
		c.API = Chat
	case last == "completions":
		c.API = Completions
	case last == "embeddings":
		c.API, c.NoOutput = Embeddings, true
	case last == "responses":
		c.API = Responses
	case last == "input_tokens" && prev == "responses":
		c.API, c.NoOutput = Responses, true
	case last == "messages" && prev2 != "threads":
		c.API = Messages
	case last == "count_tokens" && prev == "messages":
		c.API, c.NoOutput = Messages, true
	case last == "converse" || last == "converse-stream":
		return c.bedrock(path, last, Converse)
	case last == "invoke" || last == "invoke-with-response-stream":
		return c.bedrock(path, last, Invoke)
	case last == "count-tokens":
		// Its body wraps a Converse or InvokeModel request, which is not
		// read: the call is free, and produces no output.
		c = c.bedrock(path, last, Converse)
		c.NoOutput = c.API == Converse
	case last == "chat" && prev == "v2":
		c.API = CohereChat
	default:
		return c.method(path, last)
	}
	return c
}

// method reads a Google-style …/<model>:<method> call, whose last segment
// is last.
func (c Call) method(path, last string) Call {
	model, method, ok := strings.Cut(last, ":")
	if !ok {
		return c
	}
	named := prev(path) == "models" // …/models/<model>, not …/tunedModels/<model>
	switch method {
	case "generateContent", "streamGenerateContent", "countTokens":
		c.API, c.NoOutput = Gemini, method == "countTokens"
	case "rawPredict", "streamRawPredict":
		if !strings.Contains(path, "/publishers/anthropic/") {
			return c
		}
		c.API, c.NoOutput = Messages, model == "count-tokens"
		named = named && !c.NoOutput
	case "embedContent", "batchEmbedContents":
	default:
		return c
	}
	if named {
		c.Model = model
	}
	return c
}

// bedrock reads a Bedrock runtime call …/model/<model>/<method>, whose
// method is last: its model is all between the last /model/ and the
// method, since an ARN has slashes of its own.
func (c Call) bedrock(path, method string, api API) Call {
	i := strings.LastIndex(path, "/model/")
	if i < 0 || len(path)-len(method)-1 <= i+len("/model/") {
		return c
	}
	c.API, c.Model, c.Azure = api, path[i+len("/model/"):len(path)-len(method)-1], false
	return c
}

// prev is the segment before path's last.
func prev(path string) string {
	rest, _ := cutLast(path)
	_, p := cutLast(rest)
	return p
}

// cutLast splits path at its last slash.
func cutLast(path string) (rest, last string) {
	i := strings.LastIndexByte(path, '/')
	return path[:max(i, 0)], path[i+1:]
}
