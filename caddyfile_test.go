package ratelimit

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard" // encode, reverse_proxy, map, … and the caddyfile adapter
)

type caddyfileGoodCase struct {
	name  string
	input string
	want  *Handler
}

var caddyfileGoodCases = []caddyfileGoodCase{
	{
		name:  "bare directive: in-process store, no scopes, defaults",
		input: `rolter_ratelimit`,
		want:  &Handler{},
	},
	{
		name:  "empty block",
		input: "rolter_ratelimit {\n}",
		want:  &Handler{},
	},
	{
		name: "everything",
		input: `rolter_ratelimit {
			redis rediss://:secret@redis.internal:6380/2 {
				timeout 250ms
			}
			scope key {http.request.header.X-Api-Key}
			scope project {http.request.header.X-Project}
			scope team {http.vars.team}
			scope org {http.request.header.X-Org}
			limit key * rpm 60 tpm 100000
			limit key {env.VIP_KEY} tpm 2000000 rpm 600
			limit project * rpm 1000
			limit team ml-research tpm 5000000
			limit org * tpm 100000000000
			on_redis_error deny
			on_refusal error
			headers openai ietf
		}`,
		want: &Handler{
			Redis: &RedisConfig{URL: "rediss://:secret@redis.internal:6380/2", Timeout: caddy.Duration(250 * time.Millisecond)},
			Scopes: []Scope{
				{Name: "key", Value: "{http.request.header.X-Api-Key}"},
				{Name: "project", Value: "{http.request.header.X-Project}"},
				{Name: "team", Value: "{http.vars.team}"},
				{Name: "org", Value: "{http.request.header.X-Org}"},
			},
			Limits: []LimitConfig{
				{Scope: "key", ID: "*", RPM: 60, TPM: 100000},
				{Scope: "key", ID: "{env.VIP_KEY}", RPM: 600, TPM: 2000000},
				{Scope: "project", ID: "*", RPM: 1000},
				{Scope: "team", ID: "ml-research", TPM: 5000000},
				{Scope: "org", ID: "*", TPM: 100000000000},
			},
			OnRedisError: "deny",
			OnRefusal:    "error",
			Headers:      []string{"openai", "ietf"},
		},
	},
	{
		name: "token reservation options",
		input: `rolter_ratelimit {
			scope org {http.request.header.X-Org}
			limit org * tpm 10000
			reserve_tokens off
			reserve_output 256
			body_memory 16MiB
			dialect anthropic
			headers anthropic ietf
		}`,
		want: &Handler{
			Scopes:        []Scope{{Name: "org", Value: "{http.request.header.X-Org}"}},
			Limits:        []LimitConfig{{Scope: "org", ID: "*", TPM: 10000}},
			ReserveTokens: new(bool),
			ReserveOutput: 256,
			BodyMemory:    16 << 20,
			Dialect:       "anthropic",
			Headers:       []string{"anthropic", "ietf"},
		},
	},
	{
		name: "readable and required scopes, options in any order",
		input: `rolter_ratelimit {
			scope key {http.request.header.X-Api-Key} required
			scope team {http.request.header.X-Team} readable
			scope org {http.request.header.X-Org} required readable
			scope user {http.request.header.X-User} readable required
			scope tags {http.request.header.X-Tags} joined readable
			limit org * rpm 5
		}`,
		want: &Handler{
			Scopes: []Scope{
				{Name: "key", Value: "{http.request.header.X-Api-Key}", Required: true},
				{Name: "team", Value: "{http.request.header.X-Team}", Readable: true},
				{Name: "org", Value: "{http.request.header.X-Org}", Readable: true, Required: true},
				{Name: "user", Value: "{http.request.header.X-User}", Readable: true, Required: true},
				{Name: "tags", Value: "{http.request.header.X-Tags}", Readable: true, Joined: true},
			},
			Limits: []LimitConfig{{Scope: "org", ID: "*", RPM: 5}},
		},
	},
	{
		name: "caps on requests in flight, alone and beside the others",
		input: `rolter_ratelimit {
			scope key {http.request.header.X-Api-Key}
			scope team {http.request.header.X-Team}
			limit key * rpm 60 tpm 100000 concurrent 5
			limit team * concurrent 50
			slot_lease 10s
		}`,
		want: &Handler{
			Scopes: []Scope{
				{Name: "key", Value: "{http.request.header.X-Api-Key}"},
				{Name: "team", Value: "{http.request.header.X-Team}"},
			},
			Limits: []LimitConfig{
				{Scope: "key", ID: "*", RPM: 60, TPM: 100000, Concurrent: 5},
				{Scope: "team", ID: "*", Concurrent: 50},
			},
			SlotLease: caddy.Duration(10 * time.Second),
		},
	},
	{
		name: "limits that learn the provider's quota, with caps of their own or none",
		input: `rolter_ratelimit {
			scope key {http.request.header.X-Api-Key}
			scope provider openai-org1/{http.rolter_ratelimit.model} readable
			limit key * rpm 60
			limit provider * tpm 2000000 rpm 10000 learn
			limit provider openai-org1/gpt-4o-mini learn
		}`,
		want: &Handler{
			Scopes: []Scope{
				{Name: "key", Value: "{http.request.header.X-Api-Key}"},
				{Name: "provider", Value: "openai-org1/{http.rolter_ratelimit.model}", Readable: true},
			},
			Limits: []LimitConfig{
				{Scope: "key", ID: "*", RPM: 60},
				{Scope: "provider", ID: "*", RPM: 10000, TPM: 2000000, Learn: true},
				{Scope: "provider", ID: "openai-org1/gpt-4o-mini", Learn: true},
			},
		},
	},
	{
		name: "a limit with floors, whose scope line may come after it",
		input: `rolter_ratelimit {
			scope provider openai readable
			limit provider * tpm 600000 floor plan prod 60% floor plan batch 10%
			scope plan {http.request.header.X-Plan}
		}`,
		want: &Handler{
			Scopes: []Scope{{Name: "provider", Value: "openai", Readable: true}, {Name: "plan", Value: "{http.request.header.X-Plan}"}},
			Limits: []LimitConfig{{Scope: "provider", ID: "*", TPM: 600000, Floors: []FloorConfig{{Scope: "plan", ID: "prod", Percent: 60}, {Scope: "plan", ID: "batch", Percent: 10}}}},
		},
	},
	{
		name: "a limit that notifies, in any order, beside its other options",
		input: `rolter_ratelimit {
			scope team {http.request.header.X-Team}
			limit team * notify 100% 80% 95% budget_month 500 rpm 60
			price * input 1 output 1
		}`,
		want: &Handler{
			Scopes: []Scope{{Name: "team", Value: "{http.request.header.X-Team}"}},
			Limits: []LimitConfig{{Scope: "team", ID: "*", RPM: 60, BudgetMonth: "500", Notify: []json.Number{"1", "0.8", "0.95"}}},
			Prices: []PriceConfig{{Model: "*", Input: "1", Output: "1"}},
		},
	},
	{
		name: "a top line before its scopes, with n",
		input: `rolter_ratelimit {
			top key team 20
			scope key {http.request.header.X-Api-Key}
			scope team {http.request.header.X-Team}
		}`,
		want: &Handler{
			Scopes: []Scope{{Name: "key", Value: "{http.request.header.X-Api-Key}"}, {Name: "team", Value: "{http.request.header.X-Team}"}},
			Top:    &TopConfig{Scopes: []string{"key", "team"}, N: 20},
		},
	},
	{
		name: "limit before its scope line",
		input: `rolter_ratelimit {
			limit org acme rpm 5
			scope org {http.request.header.X-Org}
		}`,
		want: &Handler{
			Scopes: []Scope{{Name: "org", Value: "{http.request.header.X-Org}"}},
			Limits: []LimitConfig{{Scope: "org", ID: "acme", RPM: 5}},
		},
	},
	{
		name: "redis without a block keeps the default timeout",
		input: `rolter_ratelimit {
			redis redis://127.0.0.1:6379/0
			on_redis_error allow
			on_refusal respond
		}`,
		want: &Handler{
			Redis:        &RedisConfig{URL: "redis://127.0.0.1:6379/0"},
			OnRedisError: "allow",
			OnRefusal:    "respond",
		},
	},
	{
		name: "unix socket, duration in days, empty block after redis",
		input: `rolter_ratelimit {
			redis unix:///run/redis/redis.sock?db=3 {
				timeout 1d
			}
		}`,
		want: &Handler{Redis: &RedisConfig{URL: "unix:///run/redis/redis.sock?db=3", Timeout: caddy.Duration(24 * time.Hour)}},
	},
	{
		name: "redis URL placeholder is kept for Provision",
		input: `rolter_ratelimit {
			redis {env.REDIS_URL}
		}`,
		want: &Handler{Redis: &RedisConfig{URL: "{env.REDIS_URL}"}},
	},
	{
		name: "token buckets alone and mixed with rpm and tpm, in any order; status; scg headers",
		input: `rolter_ratelimit {
			scope key {http.request.header.X-Api-Key}
			scope org {http.request.header.X-Org}
			limit key * rate 0.5 burst 10
			limit key vip burst 100 rpm 600 rate 20 cost 2
			limit org * tpm 50000 rate 1000 burst 2000 rpm 3000
			status 503
			headers scg openai
		}`,
		want: &Handler{
			Scopes: []Scope{
				{Name: "key", Value: "{http.request.header.X-Api-Key}"},
				{Name: "org", Value: "{http.request.header.X-Org}"},
			},
			Limits: []LimitConfig{
				{Scope: "key", ID: "*", Rate: "0.5", Burst: 10},
				{Scope: "key", ID: "vip", RPM: 600, Rate: "20", Burst: 100, Cost: 2},
				{Scope: "org", ID: "*", RPM: 3000, TPM: 50000, Rate: "1000", Burst: 2000},
			},
			Status:  503,
			Headers: []string{"scg", "openai"},
		},
	},
	{
		name: "every window cap, per minute and per day, in any order",
		input: `rolter_ratelimit {
			scope model {http.rolter_ratelimit.model} readable
			limit model claude-sonnet-4* otpm 80000 rpm 4000 itpm 2000000
			limit model gpt-4o* tpd 900000000 rpd 10000 itpd 800000000 otpd 100000000 tpm 2000000
		}`,
		want: &Handler{
			Scopes: []Scope{{Name: "model", Value: "{http.rolter_ratelimit.model}", Readable: true}},
			Limits: []LimitConfig{
				{Scope: "model", ID: "claude-sonnet-4*", RPM: 4000, ITPM: 2000000, OTPM: 80000},
				{Scope: "model", ID: "gpt-4o*", TPM: 2000000, RPD: 10000, TPD: 900000000, ITPD: 800000000, OTPD: 100000000},
			},
		},
	},
	{
		name: "headers off",
		input: `rolter_ratelimit {
			headers off
		}`,
		want: &Handler{Headers: []string{"off"}},
	},
	{
		name: "quoted values are kept verbatim; same id in two scopes; default and own limit",
		input: `rolter_ratelimit {
			scope key "{http.request.header.Authorization}"
			scope org "acme corp"
			limit key "sk-abc def" rpm 1
			limit org "sk-abc def" rpm 2
			limit key * rpm 3
		}`,
		want: &Handler{
			Scopes: []Scope{
				{Name: "key", Value: "{http.request.header.Authorization}"},
				{Name: "org", Value: "acme corp"},
			},
			Limits: []LimitConfig{
				{Scope: "key", ID: "sk-abc def", RPM: 1},
				{Scope: "org", ID: "sk-abc def", RPM: 2},
				{Scope: "key", ID: "*", RPM: 3},
			},
		},
	},
	{
		name: "a scope with no limit is allowed",
		input: `rolter_ratelimit {
			scope key {http.request.header.X-Api-Key}
		}`,
		want: &Handler{Scopes: []Scope{{Name: "key", Value: "{http.request.header.X-Api-Key}"}}},
	},
}

func TestCaddyfileParsesEveryDocumentedForm(t *testing.T) {
	// An id's placeholder must resolve when the config loads, and a redis
	// URL's must not be empty then.
	t.Setenv("VIP_KEY", "sk-vip")
	t.Setenv("REDIS_URL", "redis://127.0.0.1:6379/0")
	for _, tc := range caddyfileGoodCases {
		t.Run(tc.name, func(t *testing.T) {
			got := new(Handler)
			if err := got.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input)); err != nil {
				t.Fatalf("UnmarshalCaddyfile: %v", err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %s\nwant %s", cfJSON(t, got), cfJSON(t, tc.want))
			}
			if err := got.Validate(); err != nil {
				t.Errorf("the JSON validation rejects what the Caddyfile accepted: %v", err)
			}
		})
	}
}

type caddyfileBadCase struct {
	name  string
	input string
	want  string // part of the message
	line  int    // the line the error must blame, in Testfile
}

var caddyfileBadCases = append([]caddyfileBadCase{
	// the directive itself
	{"argument after the directive", "rolter_ratelimit foo {\n}", "wrong argument count", 1},
	{"argument after the directive, without block", "rolter_ratelimit 100", "wrong argument count", 1},
	{"unknown subdirective", "rolter_ratelimit {\n\tscope key x\n\trate 5\n}", "unrecognized rolter_ratelimit subdirective 'rate'", 3},

	// redis
	{"redis twice", "rolter_ratelimit {\n\tredis redis://a:6379\n\tredis redis://b:6379\n}", "redis is given twice", 3},
	{"redis without URL", "rolter_ratelimit {\n\tredis\n}", "wrong argument count", 2},
	{"redis with only a block", "rolter_ratelimit {\n\tredis {\n\t\ttimeout 1s\n\t}\n}", "wrong argument count or unexpected line ending after 'redis'", 2},
	{"redis with two URLs", "rolter_ratelimit {\n\tredis redis://a redis://b\n}", "wrong argument count", 2},
	{"redis with an http URL", "rolter_ratelimit {\n\tscope key x\n\tredis http://redis:6379\n}", "invalid redis URL", 3},
	{"redis with a bad port", "rolter_ratelimit {\n\tredis redis://redis:port\n}", "invalid redis URL", 2},
	{"redis with an unknown protocol", "rolter_ratelimit {\n\tredis redis://redis:6379?protocol=4\n}", "protocol 4: RESP2 or RESP3", 2},
	{"redis with an empty URL", "rolter_ratelimit {\n\tredis \"\"\n}", "redis needs exactly one of a URL, cluster URLs or a sentinel", 2},
	{"timeout not a duration", "rolter_ratelimit {\n\tredis redis://r {\n\t\ttimeout soon\n\t}\n}", `bad redis timeout "soon"`, 3},
	{"timeout without unit", "rolter_ratelimit {\n\tredis redis://r {\n\t\ttimeout 100\n\t}\n}", `bad redis timeout "100"`, 3},
	{"timeout negative", "rolter_ratelimit {\n\tredis redis://r {\n\t\ttimeout -1s\n\t}\n}", "redis timeout must not be negative", 3},
	{"timeout zero", "rolter_ratelimit {\n\tredis redis://r {\n\t\ttimeout 0s\n\t}\n}", "redis timeout must be positive", 3},
	{"timeout without value", "rolter_ratelimit {\n\tredis redis://r {\n\t\ttimeout\n\t}\n}", "wrong argument count", 3},
	{"timeout with two values", "rolter_ratelimit {\n\tredis redis://r {\n\t\ttimeout 1s 2s\n\t}\n}", "wrong argument count", 3},
	{"timeout twice", "rolter_ratelimit {\n\tredis redis://r {\n\t\ttimeout 1s\n\t\ttimeout 2s\n\t}\n}", "timeout is given twice", 4},
	{"unknown redis subdirective", "rolter_ratelimit {\n\tredis redis://r {\n\t\tdatabase 3\n\t}\n}", "unrecognized redis subdirective 'database'", 3},
	{"redis cluster without URLs", "rolter_ratelimit {\n\tredis cluster\n}", "redis cluster needs at least one node URL", 2},
	{"redis cluster with a bad URL", "rolter_ratelimit {\n\tredis cluster redis://a:1 http://b:2\n}", "invalid redis URL", 2},
	{"redis sentinel without URLs", "rolter_ratelimit {\n\tredis sentinel mymaster\n}", "redis sentinel needs a master name and at least one sentinel URL", 2},
	{"sentinel credentials without sentinel", "rolter_ratelimit {\n\tredis redis://r {\n\t\tsentinel_password x\n\t}\n}", "sentinel_password is only for redis sentinel", 3},
	{"pool_size zero", "rolter_ratelimit {\n\tredis redis://r {\n\t\tpool_size 0\n\t}\n}", `pool_size must be a positive integer, not "0"`, 3},
	{"tls with a value", "rolter_ratelimit {\n\tredis redis://r {\n\t\ttls yes\n\t}\n}", "wrong argument count", 3},

	// scope
	{"scope without value", "rolter_ratelimit {\n\tscope key\n}", "wrong argument count", 2},
	{"scope without anything", "rolter_ratelimit {\n\tscope\n}", "wrong argument count", 2},
	{"scope with an unknown option", "rolter_ratelimit {\n\tscope key {http.request.header.X-Api-Key} extra\n}", "unrecognized scope option 'extra': expecting readable, required or joined", 2},
	{"dialect unknown", "rolter_ratelimit {\n\tdialect mistral\n}", `dialect must be openai, anthropic, gemini, bedrock or cohere, not "mistral"`, 2},
	{"reserve_tokens with a bad value", "rolter_ratelimit {\n\treserve_tokens yes\n}", `reserve_tokens must be on or off, not "yes"`, 2},
	{"reserve_tokens twice", "rolter_ratelimit {\n\treserve_tokens on\n\treserve_tokens off\n}", "reserve_tokens is given twice", 3},
	{"reserve_output zero", "rolter_ratelimit {\n\treserve_output 0\n}", `reserve_output must be a positive number of tokens, not "0"`, 2},
	{"reserve_output negative", "rolter_ratelimit {\n\treserve_output -5\n}", `reserve_output must be a positive number of tokens, not "-5"`, 2},
	{"reserve_output without a value", "rolter_ratelimit {\n\treserve_output\n}", "wrong argument count", 2},
	{"an id that resolves to nothing", "rolter_ratelimit {\n\tscope key {http.request.header.X-Api-Key}\n\tlimit key {env.ROLTER_TEST_UNSET_ID} rpm 5\n}", `limit for scope "key" id "{env.ROLTER_TEST_UNSET_ID}": the id resolves to nothing when the config loads, so it would limit no request`, 3},
	{"a cap known at load that resolves to nothing", "rolter_ratelimit {\n\tscope key {http.request.header.X-Api-Key}\n\tlimit key * rpm {env.ROLTER_TEST_UNSET_CAP}\n}", `limit for scope "key" id "*": rpm {env.ROLTER_TEST_UNSET_CAP} is "" when the config loads: rpm must be a positive integer of at most 100000000000, not ""`, 3},
	{"a cap known at load that is not valid, and its else neither", "rolter_ratelimit {\n\tscope key {http.request.header.X-Api-Key}\n\tlimit key * concurrent {env.ROLTER_TEST_UNSET_CAP}x else 0\n}", `limit for scope "key" id "*": concurrent {env.ROLTER_TEST_UNSET_CAP}x is "x" when the config loads: concurrent must be a positive integer of at most 100000000000, not "0"`, 3},
	{"body_memory not a size", "rolter_ratelimit {\n\tbody_memory lots\n}", `body_memory must be a size such as 64MiB, not "lots"`, 2},
	{"body_memory below two bodies", "rolter_ratelimit {\n\tbody_memory 1MiB\n}", "body_memory must be at least 8388608 bytes (8MiB: two bodies of the largest size read), not 1048576", 2},
	{"slot_lease not a duration", "rolter_ratelimit {\n\tslot_lease long\n}", `slot_lease must be a positive duration such as 30s, not "long"`, 2},
	{"slot_lease below a second", "rolter_ratelimit {\n\tslot_lease 500ms\n}", "slot_lease must be at least 1s, not 500ms", 2},
	{"slot_lease twice", "rolter_ratelimit {\n\tslot_lease 10s\n\tslot_lease 20s\n}", "slot_lease is given twice", 3},
	{"body_memory twice", "rolter_ratelimit {\n\tbody_memory 16MiB\n\tbody_memory 32MiB\n}", "body_memory is given twice", 3},
	{"scope option twice", "rolter_ratelimit {\n\tscope org x readable required readable\n}", "readable is given twice", 2},
	{"scope with a bad name", "rolter_ratelimit {\n\tscope \"api key\" x\n}", `scope name "api key"`, 2},
	{"scope with an empty value", "rolter_ratelimit {\n\tscope key \" \"\n}", `scope "key" has an empty value`, 2},
	{"scope twice", "rolter_ratelimit {\n\tscope key {http.request.header.A}\n\tscope org x\n\tscope key {http.request.header.B}\n}", `scope "key" is defined twice`, 4},
	{"scope with a block", "rolter_ratelimit {\n\tscope key x {\n\t\tfoo\n\t}\n}", "scope takes no block", 2},

	// limit
	{"limit for an undeclared scope", "rolter_ratelimit {\n\tscope key x\n\tlimit org * rpm 5\n}", `limit for scope "org", which has no scope line`, 3},
	{"limit for an undeclared scope, among declared ones", "rolter_ratelimit {\n\tlimit key * rpm 5\n\tscope key x\n\tlimit team * rpm 5\n\tscope org y\n\tlimit org * rpm 5\n}", `limit for scope "team", which has no scope line`, 4},
	{"limit twice for the same id", "rolter_ratelimit {\n\tscope key x\n\tlimit key abc rpm 5\n\tlimit key * rpm 1\n\tlimit key abc tpm 50\n}", `a second limit for scope "key" id "abc"`, 5},
	{"default limit twice", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rpm 5\n\tlimit key * rpm 5\n}", `a second limit for scope "key" id "*"`, 4},
	{"limit without id", "rolter_ratelimit {\n\tscope key x\n\tlimit key\n}", "wrong argument count", 3},
	{"limit without anything", "rolter_ratelimit {\n\tlimit\n}", "wrong argument count", 2},
	{"limit without rpm or tpm", "rolter_ratelimit {\n\tscope key x\n\tlimit key *\n}", `limit for scope "key" id "*" sets no cap: give rpm, tpm, itpm, otpm, rpd, tpd, itpd, otpd, rate, burst, cost, concurrent, budget_day or budget_month`, 3},
	{"limit with an empty id", "rolter_ratelimit {\n\tscope key x\n\tlimit key \"\" rpm 5\n}", `limit for scope "key" has an empty id`, 3},
	{"rpm zero", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rpm 0\n}", `rpm must be a positive integer, not "0"`, 3},
	{"tpm zero", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rpm 5 tpm 0\n}", `tpm must be a positive integer, not "0"`, 3},
	{"rpm negative", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rpm -5\n}", `rpm must be a positive integer, not "-5"`, 3},
	{"rpm with a plus sign", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rpm +5\n}", `rpm must be a positive integer, not "+5"`, 3},
	{"rpm not a number", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rpm many\n}", `rpm must be a positive integer, not "many"`, 3},
	{"rpm fractional", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rpm 1.5\n}", `rpm must be a positive integer, not "1.5"`, 3},
	{"rpm with a unit", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rpm 5k\n}", `rpm must be a positive integer, not "5k"`, 3},
	{"tpm overflows int64", "rolter_ratelimit {\n\tscope key x\n\tlimit key * tpm 9223372036854775808\n}", `tpm must be a positive integer, not "9223372036854775808"`, 3},
	{"tpm overflows uint64", "rolter_ratelimit {\n\tscope key x\n\tlimit key * tpm 99999999999999999999999\n}", "tpm must be a positive integer", 3},
	{"rpm without value", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rpm\n}", "wrong argument count or unexpected line ending after 'rpm'", 3},
	{"tpm without value after rpm", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rpm 5 tpm\n}", "wrong argument count or unexpected line ending after 'tpm'", 3},
	{"rpm twice", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rpm 5 tpm 10 rpm 6\n}", "rpm is given twice", 3},
	{"tpm twice", "rolter_ratelimit {\n\tscope key x\n\tlimit key * tpm 5 tpm 5\n}", "tpm is given twice", 3},
	{"rpd zero", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rpd 0\n}", `rpd must be a positive integer, not "0"`, 3},
	{"itpd twice", "rolter_ratelimit {\n\tscope key x\n\tlimit key * itpd 5 otpd 5 itpd 6\n}", "itpd is given twice", 3},
	{"otpm without value", "rolter_ratelimit {\n\tscope key x\n\tlimit key * otpm\n}", "wrong argument count or unexpected line ending after 'otpm'", 3},
	{"tpd above the largest cap", "rolter_ratelimit {\n\tscope key x\n\tlimit key * tpd 100000000001\n}", `limit for scope "key" id "*": tpd must be a positive integer of at most 100000000000, not 100000000001`, 3},
	{"unknown limit option", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rps 5\n}", "unrecognized limit option 'rps': expecting rpm, tpm, itpm, otpm, rpd, tpd, itpd, otpd, rate, burst, cost, concurrent, budget_day or budget_month, or shadow, learn, floor or notify", 3},
	{"concurrent zero", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rpm 5 concurrent 0\n}", `concurrent must be a positive integer, not "0"`, 3},
	{"concurrent negative", "rolter_ratelimit {\n\tscope key x\n\tlimit key * concurrent -5\n}", `concurrent must be a positive integer, not "-5"`, 3},
	{"concurrent without value", "rolter_ratelimit {\n\tscope key x\n\tlimit key * concurrent\n}", "wrong argument count or unexpected line ending after 'concurrent'", 3},
	{"concurrent twice", "rolter_ratelimit {\n\tscope key x\n\tlimit key * concurrent 5 rpm 1 concurrent 6\n}", "concurrent is given twice", 3},
	{"concurrent above the largest cap", "rolter_ratelimit {\n\tscope key x\n\tlimit key * concurrent 100000000001\n}", `limit for scope "key" id "*": concurrent must be a positive integer of at most 100000000000, not 100000000001`, 3},
	{"rate without burst", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rate 5\n}", `limit for scope "key" id "*": a token bucket needs a burst (its capacity) with its rate`, 3},
	{"burst without rate", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rpm 5 burst 10\n}", `limit for scope "key" id "*": a token bucket needs a rate (tokens per second) with its burst`, 3},
	{"cost without a bucket", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rpm 5 cost 2\n}", `a token bucket needs a rate (tokens per second) with its burst`, 3},
	{"cost above the burst", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rate 1 burst 3 cost 4\n}", `cost 4 is above the burst 3, so no request would ever be admitted`, 3},
	{"rate zero", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rate 0 burst 3\n}", `rate "0": must be above 0`, 3},
	{"rate zero with decimals", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rate 0.000 burst 3\n}", `rate "0.000": must be above 0`, 3},
	{"rate with four decimals", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rate 0.0005 burst 3\n}", `rate "0.0005": at most three decimal places`, 3},
	{"rate in exponent form", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rate 1e3 burst 3\n}", `rate "1e3": want tokens per second as a decimal such as 10 or 0.5`, 3},
	{"rate negative", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rate -1 burst 3\n}", `rate "-1": want tokens per second`, 3},
	{"rate without a leading digit", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rate .5 burst 3\n}", `rate ".5": want tokens per second`, 3},
	{"rate with a trailing dot", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rate 5. burst 3\n}", `rate "5.": want tokens per second`, 3},
	{"rate with a unit", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rate 5/s burst 3\n}", `rate "5/s": want tokens per second`, 3},
	{"rate too large", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rate 1000001 burst 3\n}", `rate "1000001": at most 1000000 per second`, 3},
	{"rate overflowing int64", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rate 99999999999999999999 burst 3\n}", `at most 1000000 per second`, 3},
	{"rate without value", "rolter_ratelimit {\n\tscope key x\n\tlimit key * burst 3 rate\n}", "wrong argument count or unexpected line ending after 'rate'", 3},
	{"rate twice", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rate 1 burst 3 rate 2\n}", "rate is given twice", 3},
	{"burst zero", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rate 1 burst 0\n}", `burst must be a positive integer, not "0"`, 3},
	{"burst too large", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rate 1 burst 1000000001\n}", "burst 1000000001 is above the largest, 1000000000", 3},
	{"burst fractional", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rate 1 burst 2.5\n}", `burst must be a positive integer, not "2.5"`, 3},
	{"cost zero", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rate 1 burst 3 cost 0\n}", `cost must be a positive integer, not "0"`, 3},
	{"cost twice", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rate 1 burst 3 cost 1 cost 2\n}", "cost is given twice", 3},
	{"limit with a block", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rpm 5 {\n\t\ttpm 6\n\t}\n}", "limit takes no block", 3},

	// caps per request and shadow limits
	{"a placeholder where a duration must be", "rolter_ratelimit {\n\tslot_lease {env.LEASE}\n}", `slot_lease must be a positive duration such as 30s, not "{env.LEASE}"`, 2},
	{"a placeholder where a status must be", "rolter_ratelimit {\n\tstatus {http.request.header.X-Status}\n}", `status must be an HTTP status from 400 to 599, not "{http.request.header.X-Status}"`, 2},
	{"a placeholder where reserve_output must be", "rolter_ratelimit {\n\treserve_output {x}\n}", `reserve_output must be a positive number of tokens, not "{x}"`, 2},
	{"a placeholder as a scope's name", "rolter_ratelimit {\n\tscope {x} y\n}", `scope name "{x}"`, 2},
	{"a placeholder as a limit's scope", "rolter_ratelimit {\n\tscope key x\n\tlimit {x} * rpm {h}\n}", `limit for scope "{x}", which has no scope line`, 3},
	{"else after a plain value", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rpm 5 else 6\n}", "else follows a cap whose value is a placeholder (rpm {http.request.header.X-Plan-Rpm} else 60)", 3},
	{"else twice", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rpm {h} else 5 else 6\n}", "else is given twice", 3},
	{"else that is not a value of the cap", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rpm {h} else abc\n}", `limit for scope "key" id "*": rpm else: rpm must be a positive integer of at most 100000000000, not "abc"`, 3},
	{"else 0", "rolter_ratelimit {\n\tscope key x\n\tlimit key * tpm {h} else 0\n}", `tpm else: tpm must be a positive integer of at most 100000000000, not "0"`, 3},
	{"else a placeholder", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rpm {h} else {g}\n}", `rpm else: rpm must be a positive integer of at most 100000000000, not "{g}"`, 3},
	{"else a rate with four decimals", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rate {h} else 0.0005 burst 3\n}", `rate else: rate "0.0005": at most three decimal places`, 3},
	{"else a budget of 0", "rolter_ratelimit {\n\tscope key x\n\tlimit key * budget_day {h} else 0\n\tprice * input 1 output 2\n}", "budget_day else: a budget of 0 would refuse every request", 3},
	{"else a cost above the burst", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rate 1 burst 2 cost {h} else 3\n}", "cost 3 is above the burst 2, so no request would ever be admitted", 3},
	{"else without a value", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rpm {h} else\n}", "wrong argument count or unexpected line ending after 'else'", 3},
	{"a cap per request given twice", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rpm {h} else 5 rpm 6\n}", "rpm is given twice", 3},
	{"a cap per request without a value", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rpm\n}", "wrong argument count or unexpected line ending after 'rpm'", 3},
	{"a floor without its share", "rolter_ratelimit {\n\tscope key x\n\tscope plan y\n\tlimit key * rpm 5 floor plan prod\n}", "floor needs a scope, an id and a share: floor plan prod 60%", 4},
	{"a floor's share without %", "rolter_ratelimit {\n\tscope key x\n\tscope plan y\n\tlimit key * rpm 5 floor plan prod 60\n}", "floor plan prod 60: the share kept is a whole percent from 1% to 100%, such as 60%", 4},
	{"a floor's share of a fraction", "rolter_ratelimit {\n\tscope key x\n\tscope plan y\n\tlimit key * rpm 5 floor plan prod 2.5%\n}", "floor plan prod 2.5%: the share kept is a whole percent", 4},
	{"a floor of 0%", "rolter_ratelimit {\n\tscope key x\n\tscope plan y\n\tlimit key * rpm 5 floor plan prod 0%\n}", "floor plan prod 0%: the share kept is a whole percent", 4},
	{"floors above the whole", "rolter_ratelimit {\n\tscope key x\n\tscope plan y\n\tlimit key * rpm 5 floor plan prod 60% floor plan batch 50%\n}", `limit for scope "key" id "*": the floors keep 110% together, more than the whole`, 4},
	{"a floor twice", "rolter_ratelimit {\n\tscope key x\n\tscope plan y\n\tlimit key * rpm 5 floor plan prod 10% floor plan prod 20%\n}", "floor plan prod is given twice", 4},
	{"a floor on the limit's own scope", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rpm 5 floor key prod 10%\n}", "floor key prod names the limit's own scope", 3},
	{"a floor on a limit it does not divide", "rolter_ratelimit {\n\tscope key x\n\tscope plan y\n\tlimit key * concurrent 5 floor plan prod 10%\n}", "floors divide windows, a token bucket or what learn learns, and the limit has none", 4},
	{"nine floors", "rolter_ratelimit {\n\tscope key x\n\tscope plan y\n\tlimit key * rpm 5 floor plan a 1% floor plan b 1% floor plan c 1% floor plan d 1% floor plan e 1% floor plan f 1% floor plan g 1% floor plan h 1% floor plan i 1%\n}", "9 floors, at most 8", 4},
	{"notify without a percent", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rpm 5 notify\n}", "notify needs the percents of each cap it reports the crossing of: notify 80% 95% 100%", 3},
	{"notify followed by another option", "rolter_ratelimit {\n\tscope key x\n\tlimit key * notify rpm 5\n}", "notify needs the percents", 3},
	{"notify of 0%", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rpm 5 notify 0%\n}", "notify 0%: a fraction is a whole percent from 1% to 100%, such as 80%", 3},
	{"notify above the whole", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rpm 5 notify 80% 120%\n}", "notify 120%: a fraction is a whole percent", 3},
	{"notify of a fraction of a percent", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rpm 5 notify 99.5%\n}", "notify 99.5%: a fraction is a whole percent", 3},
	{"a percent notified twice", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rpm 5 notify 80% 80%\n}", `limit for scope "key" id "*": notify 80% is given twice`, 3},
	{"notify given twice", "rolter_ratelimit {\n\tscope key x\n\tlimit key * notify 80% rpm 5 notify 95%\n}", "notify is given twice", 3},
	{"nine notify fractions", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rpm 5 notify 10% 20% 30% 40% 50% 60% 70% 80% 90%\n}", "9 notify fractions, at most 8", 3},
	{"top without a scope", "rolter_ratelimit {\n\tscope key x\n\ttop\n}", "top names no scope: top <scope>… [n]", 3},
	{"top with only a number", "rolter_ratelimit {\n\tscope key x\n\ttop 5\n}", "top names no scope", 3},
	{"top's n not last", "rolter_ratelimit {\n\tscope key x\n\tscope team y\n\ttop key 5 team\n}", "top's n, 5, comes last", 4},
	{"top's n of 0", "rolter_ratelimit {\n\tscope key x\n\ttop key 0\n}", "top's n must be from 1 to 1000, not 0", 3},
	{"top of a scope without a scope line", "rolter_ratelimit {\n\ttop plan\n\tscope key x\n}", `top names scope "plan", which has no scope line`, 2},
	{"top naming a scope twice", "rolter_ratelimit {\n\tscope key x\n\ttop key key\n}", `top names scope "key" twice`, 3},
	{"top given twice", "rolter_ratelimit {\n\tscope key x\n\ttop key\n\ttop key\n}", "top is given twice", 4},
	{"a floor of a scope without a scope line", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rpm 5 floor plan prod 10%\n}", `floor plan prod names scope "plan", which has no scope line`, 3},
	{"learn twice on a limit", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rpm 5 learn learn\n}", "learn is given twice", 3},
	{"learn with a value on a limit", "rolter_ratelimit {\n\tscope key x\n\tlimit key * learn on\n}", "unrecognized limit option 'on'", 3},
	{"shadow twice on a limit", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rpm 5 shadow shadow\n}", "shadow is given twice", 3},
	{"shadow alone on a limit", "rolter_ratelimit {\n\tscope key x\n\tlimit key * shadow\n}", `limit for scope "key" id "*" sets no cap`, 3},
	{"shadow with a value on a limit", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rpm 5 shadow on\n}", "unrecognized limit option 'on'", 3},
	{"an unknown limit option beside shadow", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rpm 5 shadows\n}", "unrecognized limit option 'shadows': expecting rpm, tpm, itpm, otpm, rpd, tpd, itpd, otpd, rate, burst, cost, concurrent, budget_day or budget_month, or shadow, learn, floor or notify", 3},
	{"shadow maybe", "rolter_ratelimit {\n\tshadow maybe\n}", `shadow must be on or off, not "maybe"`, 2},
	{"shadow without a value", "rolter_ratelimit {\n\tshadow\n}", "wrong argument count or unexpected line ending after 'shadow'", 2},
	{"shadow twice", "rolter_ratelimit {\n\tshadow on\n\tshadow off\n}", "shadow is given twice", 3},
	{"shadow_header yes", "rolter_ratelimit {\n\tshadow_header yes\n}", `shadow_header must be on or off, not "yes"`, 2},

	// options
	{"on_redis_error with another value", "rolter_ratelimit {\n\ton_redis_error fail\n}", `on_redis_error must be allow or deny, not "fail"`, 2},
	{"on_redis_error without value", "rolter_ratelimit {\n\ton_redis_error\n}", "wrong argument count", 2},
	{"on_redis_error with an empty value", "rolter_ratelimit {\n\ton_redis_error \"\"\n}", "on_redis_error needs a value", 2},
	{"on_redis_error with two values", "rolter_ratelimit {\n\ton_redis_error allow deny\n}", "wrong argument count", 2},
	{"on_redis_error twice", "rolter_ratelimit {\n\ton_redis_error allow\n\ton_redis_error deny\n}", "on_redis_error is given twice", 3},
	{"on_redis_error with a block", "rolter_ratelimit {\n\ton_redis_error deny {\n\t\tstatus 500\n\t}\n}", "on_redis_error takes no block", 2},
	{"on_refusal with another value", "rolter_ratelimit {\n\ton_refusal drop\n}", `on_refusal must be respond or error, not "drop"`, 2},
	{"on_refusal without value", "rolter_ratelimit {\n\ton_refusal\n}", "wrong argument count", 2},
	{"on_refusal with two values", "rolter_ratelimit {\n\ton_refusal respond error\n}", "wrong argument count", 2},
	{"on_refusal twice", "rolter_ratelimit {\n\ton_refusal respond\n\ton_refusal respond\n}", "on_refusal is given twice", 3},
	{"headers without value", "rolter_ratelimit {\n\theaders\n}", "wrong argument count", 2},
	{"headers unknown", "rolter_ratelimit {\n\theaders openai draft7\n}", `headers must be openai, ietf, scg, anthropic or off, not "draft7"`, 2},
	{"status not a number", "rolter_ratelimit {\n\tstatus TooMany\n}", `status must be an HTTP status from 400 to 599, not "TooMany"`, 2},
	{"status of a success", "rolter_ratelimit {\n\tstatus 200\n}", "status must be an HTTP status from 400 to 599, not 200", 2},
	{"status above 599", "rolter_ratelimit {\n\tstatus 600\n}", "status must be an HTTP status from 400 to 599, not 600", 2},
	{"status without value", "rolter_ratelimit {\n\tstatus\n}", "wrong argument count", 2},
	{"status twice", "rolter_ratelimit {\n\tstatus 429\n\tstatus 503\n}", "status is given twice", 3},
	{"status with a block", "rolter_ratelimit {\n\tstatus 503 {\n\t\tbody x\n\t}\n}", "status takes no block", 2},
	{"headers off with others", "rolter_ratelimit {\n\theaders ietf off\n}", "headers off cannot be combined with other header families", 2},
	{"headers twice", "rolter_ratelimit {\n\theaders openai\n\theaders ietf\n}", "headers is given twice", 3},
	{"ensure_stream_usage with another value", "rolter_ratelimit {\n\tensure_stream_usage yes\n}", `ensure_stream_usage must be on or off, not "yes"`, 2},
	{"ensure_stream_usage without value", "rolter_ratelimit {\n\tensure_stream_usage\n}", "wrong argument count", 2},
	{"realtime with an argument", "rolter_ratelimit {\n\trealtime 5\n}", "wrong argument count", 2},
	{"realtime twice", "rolter_ratelimit {\n\trealtime {\n\t}\n\trealtime {\n\t}\n}", "realtime is given twice", 4},
	{"max_connections zero", "rolter_ratelimit {\n\trealtime {\n\t\tmax_connections 0\n\t}\n}", `max_connections must be a positive integer, not "0"`, 3},
	{"max_connections not a number", "rolter_ratelimit {\n\trealtime {\n\t\tmax_connections lots\n\t}\n}", `max_connections must be a positive integer, not "lots"`, 3},
	{"max_connections without value", "rolter_ratelimit {\n\trealtime {\n\t\tmax_connections\n\t}\n}", "wrong argument count", 3},
	{"flush_interval not a duration", "rolter_ratelimit {\n\trealtime {\n\t\tflush_interval often\n\t}\n}", `flush_interval must be a positive duration, not "often"`, 3},
	{"flush_interval twice", "rolter_ratelimit {\n\trealtime {\n\t\tflush_interval 1s\n\t\tflush_interval 2s\n\t}\n}", "flush_interval is given twice", 4},
	{"unknown realtime subdirective", "rolter_ratelimit {\n\trealtime {\n\t\tidle_timeout 1m\n\t}\n}", "unrecognized realtime subdirective 'idle_timeout'", 3},
	{"ensure_stream_usage twice", "rolter_ratelimit {\n\tensure_stream_usage on\n\tensure_stream_usage off\n}", "ensure_stream_usage is given twice", 3},
}, priceAndBudgetMistakes...)

// priceAndBudgetMistakes are the mistakes of prices and budgets, which
// TestCaddyAdaptRejectsEachPriceAndBudgetMistakeWithItsLine also runs
// through caddy adapt. Paths are relative to the package's directory.
var priceAndBudgetMistakes = []caddyfileBadCase{
	{"a price file that does not parse", "rolter_ratelimit {\n\tprices testdata/prices/broken.json\n}", "price file testdata/prices/broken.json: line 5, column 5 (offset 104): invalid character '}' looking for beginning of object key string", 2},
	{"a price file that does not exist", "rolter_ratelimit {\n\tprices testdata/prices/absent.json\n}", "price file: open testdata/prices/absent.json: no such file or directory", 2},
	{"prices without a path", "rolter_ratelimit {\n\tprices\n}", "wrong argument count", 2},
	{"prices twice", "rolter_ratelimit {\n\tprices testdata/prices/litellm.json\n\tprices testdata/prices/litellm.json\n}", "prices is given twice", 3},
	{"a negative price", "rolter_ratelimit {\n\tprice gpt-4o input -2.50 output 10\n}", `price gpt-4o: input "-2.50" (USD per million tokens): negative`, 2},
	{"a negative cache write price", "rolter_ratelimit {\n\tprice claude-sonnet-4-5 input 3 output 15 cache_write -3.75\n}", `price claude-sonnet-4-5: cache_write "-3.75" (USD per million tokens): negative`, 2},
	{"a price that is not a number", "rolter_ratelimit {\n\tprice gpt-4o input cheap output 10\n}", `price gpt-4o: input "cheap" (USD per million tokens): not a decimal number`, 2},
	{"an unknown field in a price line", "rolter_ratelimit {\n\tprice gpt-4o input 2.50 output 10 batch_input 1.25\n}", "unrecognized price option 'batch_input': expecting input, output, cache_read or cache_write", 2},
	{"a price field twice", "rolter_ratelimit {\n\tprice gpt-4o input 2.50 output 10 input 3\n}", "input is given twice", 2},
	{"a price field without its value", "rolter_ratelimit {\n\tprice gpt-4o input 2.50 output\n}", "wrong argument count or unexpected line ending after 'output'", 2},
	{"a price without an output price", "rolter_ratelimit {\n\tprice gpt-4o input 2.50 cache_read 1.25\n}", "price gpt-4o needs an input and an output price (US dollars per million tokens)", 2},
	{"a price without a model", "rolter_ratelimit {\n\tprice\n}", "wrong argument count", 2},
	{"a '*' inside a price's model", "rolter_ratelimit {\n\tprice gpt-*-mini input 0.15 output 0.60\n}", "price gpt-*-mini: '*' only ends a prefix", 2},
	{"a model priced twice", "rolter_ratelimit {\n\tprice gpt-4o input 2.50 output 10\n\tprice gpt-4o input 5 output 15\n}", "price gpt-4o: given twice", 3},
	{"a budget of 0", "rolter_ratelimit {\n\tscope key x\n\tlimit key * budget_day 0\n\tprice * input 1 output 2\n}", `limit for scope "key" id "*": budget_day: a budget of 0 would refuse every request`, 3},
	{"a negative budget", "rolter_ratelimit {\n\tscope key x\n\tlimit key * budget_month -5\n\tprice * input 1 output 2\n}", `limit for scope "key" id "*": budget_month: budget "-5" (USD): negative`, 3},
	{"a budget finer than a nano-dollar", "rolter_ratelimit {\n\tscope key x\n\tlimit key * budget_day 0.0000000001\n\tprice * input 1 output 2\n}", `budget_day: budget "0.0000000001" (USD): more precision than the unit holds`, 3},
	{"a budget above the largest", "rolter_ratelimit {\n\tscope key x\n\tlimit key * budget_day 1000000.01\n\tprice * input 1 output 2\n}", `budget_day: budget "1000000.01" (USD): too large (at most 1000000, to the nano-dollar)`, 3},
	{"a budget that is not a number", "rolter_ratelimit {\n\tscope key x\n\tlimit key * budget_day $5\n\tprice * input 1 output 2\n}", `budget_day: budget "$5" (USD): not a decimal number`, 3},
	{"a budget without its value", "rolter_ratelimit {\n\tscope key x\n\tlimit key * budget_day\n\tprice * input 1 output 2\n}", "wrong argument count or unexpected line ending after 'budget_day'", 3},
	{"a budget twice", "rolter_ratelimit {\n\tscope key x\n\tlimit key * budget_day 5 budget_month 50 budget_day 6\n\tprice * input 1 output 2\n}", "budget_day is given twice", 3},
	{"a time zone that does not exist", "rolter_ratelimit {\n\tbudget_timezone Mars/Olympus_Mons\n}", `budget_timezone "Mars/Olympus_Mons" is not an IANA time zone such as Europe/Paris or America/New_York`, 2},
	{"the local time zone", "rolter_ratelimit {\n\tbudget_timezone Local\n}", "budget_timezone must name an IANA time zone such as Europe/Paris, not Local", 2},
	{"budget_timezone twice", "rolter_ratelimit {\n\tbudget_timezone UTC\n\tbudget_timezone Europe/Paris\n}", "budget_timezone is given twice", 3},
	{"a budget without any price", "rolter_ratelimit {\n\tscope key x\n\tlimit key * rpm 5\n\tlimit key vip budget_day 5\n\tbudget_timezone Europe/Paris\n}", "a limit has a budget, but no price is given (price lines or a prices file): every request under it would be refused", 4},
}

func TestCaddyfileRejectsEveryMistakeWithItsLine(t *testing.T) {
	for _, tc := range caddyfileBadCases {
		t.Run(tc.name, func(t *testing.T) {
			h := new(Handler)
			err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input))
			if err == nil {
				t.Fatalf("accepted:\n%s\nas %s", tc.input, cfJSON(t, h))
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
			if at := fmt.Sprintf(", at Testfile:%d", tc.line); !strings.HasSuffix(err.Error(), at) {
				t.Errorf("error %q does not end with %q", err, at)
			}
		})
	}
}

func TestCaddyfileRejectsLimitForUndeclaredScopeWithItsLine(t *testing.T) {
	// The scope line of "key" comes after its limit, which is fine; "org"
	// has none at all, which is found at the block's end but blamed on the
	// limit's own line, in the very format of Dispenser.WrapErr.
	input := `rolter_ratelimit {
	limit key * rpm 5
	limit org acme tpm 1000
	scope key {http.request.header.X-Api-Key}
	on_refusal error
}`
	err := new(Handler).UnmarshalCaddyfile(caddyfile.NewTestDispenser(input))
	want := `limit for scope "org", which has no scope line, at Testfile:3`
	if err == nil || err.Error() != want {
		t.Fatalf("got %v, want %s", err, want)
	}
}

// TestCaddyfileErrorsSayWhatJSONValidationSays checks that, for every mistake
// a JSON config can also make, the Caddyfile's message is the JSON
// validation's, with the line added.
func TestCaddyfileErrorsSayWhatJSONValidationSays(t *testing.T) {
	for _, tc := range []struct {
		name      string
		caddyfile string
		line      int
		json      string
	}{
		{"bad scope name", "rolter_ratelimit {\n\tscope k.y x\n}", 2,
			`{"scopes":[{"name":"k.y","value":"x"}]}`},
		{"empty scope value", "rolter_ratelimit {\n\tscope key \"\"\n}", 2,
			`{"scopes":[{"name":"key","value":""}]}`},
		{"scope twice", "rolter_ratelimit {\n\tscope key x\n\tscope key y\n}", 3,
			`{"scopes":[{"name":"key","value":"x"},{"name":"key","value":"y"}]}`},
		{"undeclared scope", "rolter_ratelimit {\n\tlimit org * rpm 1\n}", 2,
			`{"limits":[{"scope":"org","id":"*","rpm":1}]}`},
		{"limit twice", "rolter_ratelimit {\n\tscope key x\n\tlimit key a rpm 1\n\tlimit key a tpm 1\n}", 4,
			`{"scopes":[{"name":"key","value":"x"}],"limits":[{"scope":"key","id":"a","rpm":1},{"scope":"key","id":"a","tpm":1}]}`},
		{"neither rpm nor tpm", "rolter_ratelimit {\n\tscope key x\n\tlimit key a\n}", 3,
			`{"scopes":[{"name":"key","value":"x"}],"limits":[{"scope":"key","id":"a"}]}`},
		{"a day cap above the largest", "rolter_ratelimit {\n\tscope key x\n\tlimit key a tpd 100000000001\n}", 3,
			`{"scopes":[{"name":"key","value":"x"}],"limits":[{"scope":"key","id":"a","tpd":100000000001}]}`},
		{"cost above the burst", "rolter_ratelimit {\n\tscope key x\n\tlimit key a rate 1 burst 2 cost 3\n}", 3,
			`{"scopes":[{"name":"key","value":"x"}],"limits":[{"scope":"key","id":"a","rate":1,"burst":2,"cost":3}]}`},
		{"rate without burst", "rolter_ratelimit {\n\tscope key x\n\tlimit key a rate 0.5\n}", 3,
			`{"scopes":[{"name":"key","value":"x"}],"limits":[{"scope":"key","id":"a","rate":0.5}]}`},
		{"rate with four decimals", "rolter_ratelimit {\n\tscope key x\n\tlimit key a rate 0.0001 burst 2\n}", 3,
			`{"scopes":[{"name":"key","value":"x"}],"limits":[{"scope":"key","id":"a","rate":0.0001,"burst":2}]}`},
		{"concurrent above the largest", "rolter_ratelimit {\n\tscope key x\n\tlimit key a concurrent 100000000001\n}", 3,
			`{"scopes":[{"name":"key","value":"x"}],"limits":[{"scope":"key","id":"a","concurrent":100000000001}]}`},
		{"slot_lease below a second", "rolter_ratelimit {\n\tslot_lease 500ms\n}", 2, `{"slot_lease":"500ms"}`},
		{"status", "rolter_ratelimit {\n\tstatus 302\n}", 2, `{"status":302}`},
		{"on_redis_error", "rolter_ratelimit {\n\ton_redis_error maybe\n}", 2, `{"on_redis_error":"maybe"}`},
		{"on_refusal", "rolter_ratelimit {\n\ton_refusal maybe\n}", 2, `{"on_refusal":"maybe"}`},
		{"unknown header family", "rolter_ratelimit {\n\theaders openai x\n}", 2, `{"headers":["openai","x"]}`},
		{"headers off with others", "rolter_ratelimit {\n\theaders off openai\n}", 2, `{"headers":["off","openai"]}`},
		{"bad redis URL", "rolter_ratelimit {\n\tredis mysql://db\n}", 2, `{"redis":{"url":"mysql://db"}}`},
		{"negative redis timeout", "rolter_ratelimit {\n\tredis redis://r {\n\t\ttimeout -5ms\n\t}\n}", 3, `{"redis":{"url":"redis://r","timeout":"-5ms"}}`},
		{"a model priced twice", "rolter_ratelimit {\n\tprice gpt-4o input 2.50 output 10\n\tprice gpt-4o input 5 output 15\n}", 3,
			`{"prices":[{"model":"gpt-4o","input":2.50,"output":10},{"model":"gpt-4o","input":5,"output":15}]}`},
		{"a negative price", "rolter_ratelimit {\n\tprice gpt-4o input 2.50 output -10\n}", 2, `{"prices":[{"model":"gpt-4o","input":2.50,"output":-10}]}`},
		{"a budget of 0", "rolter_ratelimit {\n\tscope key x\n\tlimit key a budget_day 0.00\n}", 3,
			`{"scopes":[{"name":"key","value":"x"}],"limits":[{"scope":"key","id":"a","budget_day":0.00}]}`},
		{"a time zone that does not exist", "rolter_ratelimit {\n\tbudget_timezone Europe/Atlantis\n}", 2, `{"budget_timezone":"Europe/Atlantis"}`},
		{"top of a scope without a scope line", "rolter_ratelimit {\n\tscope key x\n\ttop key plan\n}", 3, `{"scopes":[{"name":"key","value":"x"}],"top":{"scopes":["key","plan"]}}`},
		{"an else that is not a value of the cap", "rolter_ratelimit {\n\tscope key x\n\tlimit key a rpm {h} else abc\n}", 3,
			`{"scopes":[{"name":"key","value":"x"}],"limits":[{"scope":"key","id":"a","per_request":{"rpm":{"value":"{h}","else":"abc"}}}]}`},
		{"an else above the burst", "rolter_ratelimit {\n\tscope key x\n\tlimit key a rate 1 burst 2 cost {h} else 3\n}", 3,
			`{"scopes":[{"name":"key","value":"x"}],"limits":[{"scope":"key","id":"a","rate":1,"burst":2,"per_request":{"cost":{"value":"{h}","else":"3"}}}]}`},
		{"a budget without any price, its limit before its scope", "rolter_ratelimit {\n\tlimit key * budget_month 50\n\tscope key x\n}", 2,
			`{"scopes":[{"name":"key","value":"x"}],"limits":[{"scope":"key","id":"*","budget_month":50}]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var fromJSON Handler
			if err := json.Unmarshal([]byte(tc.json), &fromJSON); err != nil {
				t.Fatal(err)
			}
			jsonErr := fromJSON.Validate()
			if jsonErr == nil {
				t.Fatalf("the JSON validation accepts %s", tc.json)
			}
			err := new(Handler).UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.caddyfile))
			want := fmt.Sprintf("%v, at Testfile:%d", jsonErr, tc.line)
			if err == nil || err.Error() != want {
				t.Errorf("Caddyfile says %v\nJSON says      %s", err, want)
			}
		})
	}
}

const caddyfileSite = `{
	admin off
}

:8080 {
	reverse_proxy 127.0.0.1:9000
	rolter_ratelimit {
		scope key {http.request.header.X-Api-Key}
		scope org {org}
		limit key * rpm 60 tpm 100000
		limit org acme tpm 1000000
	}
	encode
	request_header X-Gateway rolter
	forward_auth 127.0.0.1:9001 {
		uri /check
		copy_headers X-Org
	}
	map {http.request.header.X-Org} {org} {
		default anonymous
	}
}
`

func TestCaddyfileDirectiveNeedsNoOrderAndRunsAfterEncodeBeforeReverseProxy(t *testing.T) {
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfileSite), nil)
	if err != nil {
		t.Fatalf("adapting: %v", err)
	}
	handlers, objects := cfHandlers(t, out)
	t.Logf("handlers in order: %v", handlers)
	find := func(what string, match func(name string, obj json.RawMessage) bool) int {
		t.Helper()
		for i, name := range handlers {
			if match(name, objects[i]) {
				return i
			}
		}
		t.Fatalf("no %s handler in %s", what, out)
		return -1
	}
	named := func(want string) func(string, json.RawMessage) bool {
		return func(name string, _ json.RawMessage) bool { return name == want }
	}
	rl := find("rolter_ratelimit", named("rolter_ratelimit"))
	// map, forward_auth (a reverse_proxy to the auth service, with
	// handle_response routes nested in it), request_header (a headers
	// handler) and encode come first; after rolter_ratelimit, only the
	// upstream's reverse_proxy.
	for _, before := range []struct {
		what  string
		match func(string, json.RawMessage) bool
	}{
		{"map", named("map")},
		{"forward_auth", func(name string, obj json.RawMessage) bool {
			return name == "reverse_proxy" && bytes.Contains(obj, []byte("127.0.0.1:9001"))
		}},
		{"request_header", func(name string, obj json.RawMessage) bool {
			return name == "headers" && bytes.Contains(obj, []byte("X-Gateway"))
		}},
		{"encode", named("encode")},
	} {
		if i := find(before.what, before.match); i > rl {
			t.Errorf("%s runs after rolter_ratelimit: %v", before.what, handlers)
		}
	}
	if after := handlers[rl+1:]; !slices.Equal(after, []string{"reverse_proxy"}) {
		t.Errorf("after rolter_ratelimit come %v, want only reverse_proxy", after)
	}

	// The handler's config is the parsed one.
	raw := cfHandlerJSON(t, out, "rolter_ratelimit")
	var got Handler
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	want := Handler{
		Scopes: []Scope{{Name: "key", Value: "{http.request.header.X-Api-Key}"}, {Name: "org", Value: "{org}"}},
		Limits: []LimitConfig{{Scope: "key", ID: "*", RPM: 60, TPM: 100000}, {Scope: "org", ID: "acme", TPM: 1000000}},
	}
	if !reflect.DeepEqual(&got, &want) {
		t.Errorf("adapted handler %s, want %s", raw, cfJSON(t, &want))
	}
}

func TestCaddyfileAdapterErrorsCarryTheLine(t *testing.T) {
	for _, tc := range []struct {
		name, body, want string
	}{
		{"a bad value", `:8080 {
	rolter_ratelimit {
		scope key {http.request.header.X-Api-Key}
		limit key * rpm 0
	}
	reverse_proxy 127.0.0.1:9000
}`, `rpm must be a positive integer, not "0", at Caddyfile:4`},
		{"an undeclared scope, found at the block's end", `:8080 {
	rolter_ratelimit /v1/* {
		limit org * rpm 10
		scope key {http.request.header.X-Api-Key}
	}
	reverse_proxy 127.0.0.1:9000
}`, `limit for scope "org", which has no scope line, at Caddyfile:3`},
		{"an argument after the matcher", `:8080 {
	rolter_ratelimit @api 5 {
		scope key x
	}
	@api path /v1/*
	reverse_proxy 127.0.0.1:9000
}`, `wrong argument count or unexpected line ending after '5', at Caddyfile:2`},
		{"an undeclared scope in an imported snippet", `(limits) {
	rolter_ratelimit {
		limit team * tpm 10
	}
}

:8080 {
	import limits
	reverse_proxy 127.0.0.1:9000
}`, `limit for scope "team", which has no scope line, at Caddyfile:3 import chain ['Caddyfile:8 (import limits)']`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(tc.body), nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// A redis URL taken from a variable that is not set would otherwise fail
// as a URL that "cannot be parsed", which does not point at the variable:
// the load says the URL is empty, names its placeholder and, from a
// Caddyfile, its line.
func TestAnUnsetRedisURLVariableFailsTheLoadSayingItIsEmptyAndWhere(t *testing.T) {
	const unset = "{env.ROLTER_TEST_UNSET_REDIS_URL}"
	const want = `redis URL "` + unset + `" is empty after placeholders: is ROLTER_TEST_UNSET_REDIS_URL set?`
	for _, tc := range []struct{ name, redis, at string }{
		{"one server", "redis " + unset, "Caddyfile:4"},
		{"a cluster node", "redis cluster redis://127.0.0.1:7000 " + unset, "Caddyfile:4"},
		{"a sentinel", "redis sentinel primary " + unset, "Caddyfile:4"},
		{"in a block", "redis " + unset + " {\n\t\t\ttimeout 1s\n\t\t}", "Caddyfile:4"},
	} {
		t.Run("Caddyfile, "+tc.name, func(t *testing.T) {
			body := ":8080 {\n\trolter_ratelimit {\n\t\tscope key {http.request.header.X-Api-Key}\n\t\t" + tc.redis + "\n\t}\n\treverse_proxy 127.0.0.1:9000\n}"
			_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(body), nil)
			if err == nil || !strings.HasSuffix(err.Error(), ": "+want+", at "+tc.at) {
				t.Errorf("%s\nadapting says %v\nwant one ending %s, at %s", body, err, want, tc.at)
			}
		})
	}
	for name, redis := range map[string]*RedisConfig{
		"one server":     {URL: unset},
		"a cluster node": {Cluster: []string{"redis://127.0.0.1:7000", unset}},
		"a sentinel":     {Sentinel: &SentinelConfig{Master: "primary", URLs: []string{unset}}},
	} {
		t.Run("JSON, "+name, func(t *testing.T) {
			h := &Handler{Redis: redis}
			ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
			err := h.Provision(ctx)
			h.Cleanup()
			cancel()
			if err == nil || err.Error() != want {
				t.Errorf("Provision says %v\nwant           %s", err, want)
			}
		})
	}
}

func TestCaddyfileMatcherIsNotAnArgument(t *testing.T) {
	body := `:8080 {
	@api path /v1/*
	rolter_ratelimit @api {
		scope key {http.request.header.X-Api-Key}
		limit key * rpm 5
	}
	reverse_proxy 127.0.0.1:9000
}`
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(body), nil)
	if err != nil {
		t.Fatalf("adapting: %v", err)
	}
	if !bytes.Contains(out, []byte(`"path":["/v1/*"]`)) {
		t.Errorf("the matcher is lost: %s", out)
	}
	cfHandlerJSON(t, out, "rolter_ratelimit")
}

func FuzzUnmarshalCaddyfileNeverPanics(f *testing.F) {
	for _, tc := range caddyfileGoodCases {
		f.Add(tc.input)
	}
	for _, tc := range caddyfileBadCases {
		f.Add(tc.input)
	}
	f.Add("rolter_ratelimit {\n\tredis redis://r {\n\t\ttimeout 1s {\n\t\t}\n\t}\n\tlimit key * rpm 5 {}\n}")
	f.Add("rolter_ratelimit {\n\tlimit\n\t}\n}\n}")
	f.Fuzz(func(t *testing.T, input string) {
		tokens, err := caddyfile.Tokenize([]byte(input), "Testfile")
		if err != nil {
			return // the Caddyfile parser stops there
		}
		h := new(Handler)
		err = h.UnmarshalCaddyfile(caddyfile.NewDispenser(tokens))
		if err != nil {
			if len(tokens) > 0 && !strings.Contains(err.Error(), ", at Testfile:") {
				t.Fatalf("error without its line: %v", err)
			}
			return
		}
		if err := h.Validate(); err != nil {
			t.Fatalf("the JSON validation rejects what the Caddyfile accepted: %v\n%s", err, cfJSON(t, h))
		}
	})
}

func cfJSON(t *testing.T, h *Handler) string {
	t.Helper()
	b, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// cfHandlers lists the handler objects of an adapted config in the order
// they run: a handler before the handlers nested in it (subroute,
// handle_response), routes in their order.
func cfHandlers(t *testing.T, config []byte) (names []string, objects []json.RawMessage) {
	t.Helper()
	var walk func(json.RawMessage)
	walk = func(raw json.RawMessage) {
		var obj map[string]json.RawMessage
		if json.Unmarshal(raw, &obj) == nil {
			var name string
			if json.Unmarshal(obj["handler"], &name) == nil && name != "" {
				names = append(names, name)
				objects = append(objects, raw)
			}
			for _, k := range slices.Sorted(maps.Keys(obj)) {
				walk(obj[k])
			}
			return
		}
		var arr []json.RawMessage
		if json.Unmarshal(raw, &arr) == nil {
			for _, v := range arr {
				walk(v)
			}
		}
	}
	walk(config)
	return names, objects
}

// cfHandlerJSON finds the first handler object called name in an adapted
// config.
func cfHandlerJSON(t *testing.T, config []byte, name string) json.RawMessage {
	t.Helper()
	names, objects := cfHandlers(t, config)
	i := slices.Index(names, name)
	if i < 0 {
		t.Fatalf("no %s handler in %s", name, config)
	}
	return objects[i]
}

// TestJSONValidationRejectsEachMistakeOnlyJSONCanMake checks the mistakes of
// per_request and notify that only a JSON config can make, the Caddyfile's syntax
// having no way to write them.
func TestJSONValidationRejectsEachMistakeOnlyJSONCanMake(t *testing.T) {
	const scopes = `"scopes":[{"name":"key","value":"x"}]`
	for _, tc := range []struct{ name, limit, want string }{
		{"an unknown cap", `"per_request":{"rps":{"value":"{h}"}}`,
			`limit for scope "key" id "*": unknown per-request cap "rps": expecting rpm, tpm, itpm, otpm, rpd, tpd, itpd, otpd, rate, burst, cost, concurrent, budget_day, budget_month`},
		{"a cap given both as a value and per request", `"rpm":5,"per_request":{"rpm":{"value":"{h}"}}`,
			`limit for scope "key" id "*": rpm is given both as a value and per request`},
		{"a budget given both ways", `"budget_day":"5","per_request":{"budget_day":{"value":"{h}"}}`,
			`limit for scope "key" id "*": budget_day is given both as a value and per request`},
		{"a value without a placeholder", `"per_request":{"rpm":{"value":"60"}}`,
			`limit for scope "key" id "*": the per-request rpm "60" holds no placeholder: give it as a value`},
		{"an empty value", `"per_request":{"rpm":{"value":""}}`,
			`limit for scope "key" id "*": the per-request rpm "" holds no placeholder: give it as a value`},
		{"an else that is not a value of the cap", `"per_request":{"rpm":{"value":"{h}","else":"abc"}}`,
			`limit for scope "key" id "*": rpm else: rpm must be a positive integer of at most 100000000000, not "abc"`},
		{"an else that is a placeholder", `"per_request":{"concurrent":{"value":"{h}","else":"{g}"}}`,
			`limit for scope "key" id "*": concurrent else: concurrent must be a positive integer of at most 100000000000, not "{g}"`},
		{"a cap known at load that resolves to nothing", `"per_request":{"tpm":{"value":"{env.ROLTER_TEST_UNSET_CAP}"}}`,
			`limit for scope "key" id "*": tpm {env.ROLTER_TEST_UNSET_CAP} is "" when the config loads: tpm must be a positive integer of at most 100000000000, not ""`},
		{"an else rate with four decimals", `"burst":3,"per_request":{"rate":{"value":"{h}","else":"0.0005"}}`,
			`limit for scope "key" id "*": rate else: rate "0.0005": at most three decimal places`},
		{"a notify fraction of a fraction of a percent", `"rpm":5,"notify":[0.8,0.955]`,
			`limit for scope "key" id "*": notify 0.955: a fraction is a whole percent above 0 and at most 1, such as 0.8 (80%)`},
		{"a notify fraction above 1", `"rpm":5,"notify":[1.5]`,
			`limit for scope "key" id "*": notify 1.5: a fraction is a whole percent above 0 and at most 1, such as 0.8 (80%)`},
		{"a notify fraction of 0", `"rpm":5,"notify":[0]`,
			`limit for scope "key" id "*": notify 0: a fraction is a whole percent above 0 and at most 1, such as 0.8 (80%)`},
		{"a notify fraction given twice", `"rpm":5,"notify":[0.8,0.80]`,
			`limit for scope "key" id "*": notify 80% is given twice`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			config := `{` + scopes + `,"limits":[{"scope":"key","id":"*",` + tc.limit + `}]}`
			var h Handler
			if err := json.Unmarshal([]byte(config), &h); err != nil {
				t.Fatal(err)
			}
			if err := h.Validate(); err == nil || err.Error() != tc.want {
				t.Errorf("%s\nvalidation says %v\nwant            %s", config, err, tc.want)
			}
		})
	}
}
