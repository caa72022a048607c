package ratelimit

import (
	"net/http"
	"strings"
)

// The design of the credential placeholder and repeated headers is in the package doc, section "What the client and the upstream choose".

// credentialSource is one place an API reads its caller's credential from.
type credentialSource struct {
	header string // canonical
	bearer bool   // an "Authorization: Bearer <credential>" header
	// sigv4: AWS Signature Version 4, whose credential is the access key
	// id it names, never its signature: the Credential of an
	// "Authorization: AWS4-HMAC-SHA256 Credential=<id>/<date>/…" header, or
	// a presigned URL's X-Amz-Credential=<id>/<date>/… parameter.
	sigv4 bool
	query string // a query parameter, when header is ""
}

var (
	bearerSource    = credentialSource{header: "Authorization", bearer: true}
	azureKeySource  = credentialSource{header: "Api-Key"}
	anthropicSource = credentialSource{header: "X-Api-Key"}
	googKeySource   = credentialSource{header: "X-Goog-Api-Key"}
	googQuerySource = credentialSource{query: "key"}
	sigv4Source     = credentialSource{header: "Authorization", sigv4: true}
	sigv4Presigned  = credentialSource{query: "X-Amz-Credential", sigv4: true}
)

// credentialSources are where the API of a request reads its credential,
// by the request's dialect (its API's provider, or the dialect option):
// OpenAI's bearer token (Azure OpenAI's paths, under /openai/, also its
// api-key header), Anthropic's x-api-key and the bearer token its SDK sends
// for auth tokens, Gemini's x-goog-api-key, its ?key= and the OAuth bearer
// token of Vertex AI, Bedrock's SigV4 access key id (signed or presigned)
// and the bearer token of its API keys.
func credentialSources(req *request) []credentialSource {
	switch req.dia {
	case dialectAnthropic:
		return []credentialSource{anthropicSource, bearerSource}
	case dialectGemini:
		return []credentialSource{googKeySource, googQuerySource, bearerSource}
	case dialectBedrock:
		return []credentialSource{sigv4Source, bearerSource, sigv4Presigned}
	}
	if req.call.Azure {
		return []credentialSource{azureKeySource, bearerSource}
	}
	return []credentialSource{bearerSource}
}

// name is how an error names the source: never its value.
func (s credentialSource) name() string {
	if s.header == "" {
		return "the query parameter " + s.query
	}
	return "the header " + s.header
}

// credential is the request's credential as its API reads it ("" when it
// sends none). When the request sends it twice, in one place or in two
// that differ, the upstream's choice is unknown: ambiguous then names
// where, and the credential is "".
func credential(req *request) (value, ambiguous string) {
	var from credentialSource
	r := req.Request
	for _, s := range credentialSources(req) {
		var values []string
		if s.header != "" {
			values = r.Header[s.header]
		} else if r.URL.RawQuery != "" {
			values = r.URL.Query()[s.query]
		}
		switch {
		case len(values) == 0:
			continue
		case len(values) > 1:
			return "", s.name() + " more than once"
		}
		v, ok := s.read(values[0])
		if !ok {
			continue
		}
		switch {
		case v == "":
		case value == "":
			value, from = v, s
		case v != value:
			return "", "two credentials, in " + from.name() + " and " + s.name()
		}
	}
	return value, ""
}

// read is the credential a value of the source carries, if it carries one
// in the source's form.
func (s credentialSource) read(v string) (string, bool) {
	switch {
	case s.bearer:
		return cutBearer(v)
	case s.sigv4 && s.header != "":
		return sigv4KeyID(v)
	case s.sigv4:
		id, _, ok := strings.Cut(v, "/")
		return id, ok
	}
	return v, true
}

// sigv4KeyID is the access key id of an Authorization header of AWS's
// Signature Version 4 (AWS4-HMAC-SHA256, or SigV4a's AWS4-ECDSA-P256-SHA256):
// the first part of its Credential, which names the key; the signature,
// which proves it, is never read.
func sigv4KeyID(authorization string) (string, bool) {
	scheme, params, ok := strings.Cut(strings.TrimSpace(authorization), " ")
	if !ok || !strings.HasPrefix(scheme, "AWS4-") {
		return "", false
	}
	for param := range strings.SplitSeq(params, ",") {
		if scope, ok := strings.CutPrefix(strings.TrimSpace(param), "Credential="); ok {
			id, _, ok := strings.Cut(scope, "/")
			return id, ok
		}
	}
	return "", false
}

// cutBearer is the token of an Authorization header of the Bearer scheme.
func cutBearer(authorization string) (string, bool) {
	scheme, token, ok := strings.Cut(strings.TrimSpace(authorization), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	return strings.TrimSpace(token), true
}

// repeatedScopeHeader is the first scope whose value is one request header
// that the request sends more than once (and whose scope does not declare
// it a list), or -1.
func (h *Handler) repeatedScopeHeader(r *http.Request) int {
	for i, name := range h.scopeHeaders {
		if name != "" && !h.Scopes[i].Joined && len(r.Header[name]) > 1 {
			return i
		}
	}
	return -1
}
