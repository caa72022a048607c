package ratelimit

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"

	"github.com/rolter/caddy-ratelimit/internal/pricing"
)

// The directive's place in Caddy's order is in UnmarshalCaddyfile's doc.
func init() {
	httpcaddyfile.RegisterHandlerDirective("rolter_ratelimit", parseCaddyfile)
	httpcaddyfile.RegisterDirectiveOrder("rolter_ratelimit", httpcaddyfile.After, "encode")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	rl := new(Handler)
	if err := rl.UnmarshalCaddyfile(h.Dispenser); err != nil {
		return nil, err
	}
	return rl, nil
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	rolter_ratelimit [<matcher>] {
//		redis <url>                                # one server: redis://, rediss://, unix://; absent: the in-process store
//		redis cluster <url> [<url>...]             # or: seed nodes of a Redis Cluster
//		redis sentinel <master-name> <url> [<url>...]  # or: the sentinels that watch a primary
//		redis ... {                                # optional, after any of the three forms
//			timeout <duration>                     # one admission's bound, dial and replay included; default 100ms
//			pool_size <n>                          # connections per node
//			username <user>                        # for the data nodes; placeholders such as {env.REDIS_USER}
//			password <password>
//			sentinel_username <user>               # for the sentinels themselves
//			sentinel_password <password>
//			tls                                    # TLS even for redis:// URLs
//		}
//		scope <name> <value> [readable] [required] [joined]  # repeatable; <value> is usually a placeholder
//		limit <scope> <id>|<prefix>*|* [rpm|tpm|itpm|otpm|rpd|tpd|itpd|otpd <n>]... [rate <per-second> burst <n> [cost <n>]] [concurrent <n>]
//		      [budget_day <usd>] [budget_month <usd>] [shadow] [learn] [floor <scope> <id> <percent>%]...
//		                                           # repeatable; rpm requests, tpm tokens, itpm input tokens and otpm
//		                                           # output tokens per minute; rpd, tpd, itpd, otpd per day;
//		                                           # concurrent: requests in flight at once; budget_day and
//		                                           # budget_month: US dollars spent per calendar day and month;
//		                                           # any <n> or <usd> may be a placeholder, resolved per request,
//		                                           # followed by else <value> for when it is missing or not valid;
//		                                           # shadow: counted, never refusing (a limit being tried);
//		                                           # learn: admits within the provider's quota as its answers report it;
//		                                           # floor: keeps that share of each cap for requests whose id in
//		                                           # <scope> is <id> while they ask (at most 8, 100% together);
//		                                           # <prefix>* is one pool for every id starting with
//		                                           # <prefix> (the longest wins; an exact id beats it); * is the
//		                                           # default for every id of that scope
//		on_redis_error allow|deny                  # default allow (fail open; never under a budget); deny answers 503
//		on_refusal respond|error                   # default respond: the handler writes the refusal itself
//		status <code>                              # of every refusal by a limit, 400-599; default 429
//		headers openai|ietf|scg|anthropic|off ...  # default: the dialect's (anthropic for Anthropic, else openai); several may be listed
//		dialect openai|anthropic|gemini|bedrock|cohere  # the shape of the handler's answers; default: the API the path names
//		ensure_stream_usage on|off                 # default on: ask OpenAI streams for their usage
//		reserve_tokens on|off                      # default on: reserve each request's tokens at admission
//		reserve_output <n>                         # default 1024: the output reserved for a request that names no cap
//		body_memory <size>                         # default 64MiB, at least 8MiB: request bodies being read at once, per process
//		slot_lease <duration>                      # default 30s, at least 1s: how long a dead process's slots outlive it
//		wait <duration>                            # default 0: hold a request refused by a window or bucket that
//		                                           # would admit it within this long, then admit it
//		max_waiting <n>                            # default 1000: requests waiting at once per process
//		shadow on|off                              # default off: every limit a shadow limit
//		shadow_header on|off                       # default off: X-Ratelimit-Shadow on requests a shadow limit would refuse
//		price <model>|<prefix>*|* input <usd> output <usd> [cache_read <usd>] [cache_write <usd>]
//		                                           # repeatable; US dollars per million tokens, for budgets
//		prices <path>                              # a price file in LiteLLM's model_prices_and_context_window.json format
//		budget_timezone <zone>                     # default UTC: the IANA zone whose days and months budgets cover
//		realtime {                                 # WebSocket sessions (any upgrade the matcher covers)
//			max_connections <n>                    # open sessions per Caddy process; default no cap
//			flush_interval <duration>              # how often a session's tokens are charged; default 5s
//		}
//	}
//
// The scope lines form the chain in the order they are written, innermost
// first by convention (key, project, team, org). A scope's ids are written
// in Redis keys, logs, metrics and the admin API only as digests ("#" and 32
// hex digits of their SHA-256), whatever the scope is called, unless it is
// declared readable: then a short plain id (letters, digits, '.', '_', '-';
// at most 64) is written as it is. Declare readable only ids that are not
// secret, such as project, team or org names. A request whose value for a
// required scope is empty is refused with 403 before any store call; without
// required, an empty value leaves the scope out of the request's chain. A
// request that sends the one header a scope's value names more than once is
// refused with 400 before any store call, unless the scope is joined (the
// header is a list: its values joined by commas are the id). A chain has at
// most 255 scopes. A limit needs a window cap, a token bucket, a cap on
// requests in flight, a budget, or any of them together, in any order, each
// once, and a scope line for its scope, which may come before or after it in
// the block. Window caps and concurrent are positive integers of at most
// 10^11; a day window is the trailing 24 hours, estimated from day periods
// as a minute window is from minute periods. Token caps count the tokens the
// response's usage reports: tpm and tpd all of them, itpm and itpd the input
// (prompt) tokens, otpm and otpd the output (completion) tokens. A bucket is
// rate (tokens per second, a decimal with at most three places, such as 0.5,
// of at most 1000000) with burst (its capacity, a positive integer of at
// most 10^9), and cost (what a request takes, a positive integer, default 1)
// at most the burst. <id> and <value> are kept verbatim:
// placeholders such as {env.VIP_KEY} or {http.request.header.X-Api-Key} are
// resolved when the config loads (ids) or per request (values); the
// placeholders {http.rolter_ratelimit.model}, the model the request asks
// for, and {http.rolter_ratelimit.api_key}, the credential its API reads (as
// that provider reads it: a credential in another provider's header is not
// read), can be a value or part of one (scope model {http.rolter_ratelimit.model}).
//
// A cap's value that holds a placeholder ({http.request.header.X-Plan-Rpm},
// {vars.max_parallel}) comes with each request: it is checked per request
// as a value written here is checked when the config loads, and one that
// resolves empty or is not valid takes the value after else; without else
// such a request is refused with 503, never let through unlimited. A value
// whose placeholders are all known when the config loads ({env.*},
// {file.*}) is resolved then and checked as a value written here, with its
// else, and fails the load with its line if it is not valid.
//
// A budget is a positive number of US dollars, exact to the nano-dollar, of
// at most 1000000. Requests under a budget are priced by the price lines
// and the prices file (a price line beats the file's entry of the same
// name); prices are non-negative decimals, in US dollars per million
// tokens, and a price line's model is matched as a limit's id is (an exact
// name beats the longest prefix, and * comes last). A request under a
// budget whose model has no price is refused.
//
// The directive is ordered right after encode, so no order option is needed:
// it runs after map, vars, header, request_body, rewrite, basic_auth,
// forward_auth and request_header (so it sees the identity they establish),
// and before push, templates, handle, route, respond and reverse_proxy (so a
// refused request never reaches an upstream).
//
// Every mistake is reported with the file and line of the offending line,
// and the checks are those of the JSON config's validation.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume directive name
	directive := d.Token()
	if d.NextArg() {
		return d.ArgErr()
	}

	declared := make(map[string]bool)
	type limitKey struct{ scope, id string }
	seenLimits := make(map[limitKey]bool)
	type limitLine struct {
		scope  string
		tok    caddyfile.Token
		budget bool // it has budget_day or budget_month
		floors []FloorConfig
	}
	var limitLines []limitLine
	var topLine caddyfile.Token // its scopes, too, may come after it
	// Every subdirective but scope and limit is given at most once.
	given := make(map[string]bool)

	for nesting := d.Nesting(); d.NextBlock(nesting); {
		sub := d.Token()
		if sub.Text != "scope" && sub.Text != "limit" && sub.Text != "price" {
			if given[sub.Text] {
				return d.Errf("%s is given twice", sub.Text)
			}
			given[sub.Text] = true
		}
		switch sub.Text {
		case "redis":
			rc, err := parseRedis(d)
			if err != nil {
				return err
			}
			h.Redis = rc

		case "scope":
			s, err := parseScope(d)
			if err != nil {
				return err
			}
			// Handler.Validate says what is wrong with the scope itself,
			// or that its name is taken by an earlier scope line.
			chain := &Handler{Scopes: append(slices.Clip(h.Scopes), s)}
			if err := chain.Validate(); err != nil {
				return d.WrapErr(err)
			}
			if err := noBlock(d, sub); err != nil {
				return err
			}
			h.Scopes = chain.Scopes
			declared[s.Name] = true

		case "limit":
			l, err := parseLimit(d)
			if err != nil {
				return err
			}
			k := limitKey{l.Scope, l.ID}
			if seenLimits[k] {
				return d.Errf("a second limit for scope %q id %q", l.Scope, l.ID)
			}
			seenLimits[k] = true
			h.Limits = append(h.Limits, l)
			limitLines = append(limitLines, limitLine{l.Scope, sub, l.BudgetDay != "" || l.BudgetMonth != "", l.Floors})

		case "on_redis_error":
			o, err := option(d, func(v string) (*Handler, error) { return &Handler{OnRedisError: v}, nil })
			if err != nil {
				return err
			}
			h.OnRedisError = o.OnRedisError

		case "dialect":
			o, err := option(d, func(v string) (*Handler, error) { return &Handler{Dialect: v}, nil })
			if err != nil {
				return err
			}
			h.Dialect = o.Dialect

		case "on_refusal":
			o, err := option(d, func(v string) (*Handler, error) { return &Handler{OnRefusal: v}, nil })
			if err != nil {
				return err
			}
			h.OnRefusal = o.OnRefusal

		case "status":
			o, err := option(d, func(v string) (*Handler, error) {
				code, err := strconv.Atoi(v)
				if err != nil {
					return nil, fmt.Errorf("status must be an HTTP status from 400 to 599, not %q", v)
				}
				return &Handler{Status: code}, nil
			})
			if err != nil {
				return err
			}
			h.Status = o.Status

		case "headers":
			families := d.RemainingArgs()
			if len(families) == 0 {
				return d.ArgErr()
			}
			if err := validateHeaderFamilies(families); err != nil {
				return d.WrapErr(err)
			}
			if err := noBlock(d, sub); err != nil {
				return err
			}
			h.Headers = families

		case "realtime":
			realtime, err := parseRealtime(d)
			if err != nil {
				return err
			}
			h.Realtime = realtime

		case "top":
			top, err := parseTop(d)
			if err != nil {
				return err
			}
			h.Top = top
			topLine = sub

		case "ensure_stream_usage", "reserve_tokens":
			on, err := onOff(d)
			if err != nil {
				return err
			}
			if sub.Text == "reserve_tokens" {
				h.ReserveTokens = &on
			} else {
				h.EnsureStreamUsage = &on
			}

		case "shadow", "shadow_header":
			on, err := onOff(d)
			if err != nil {
				return err
			}
			if sub.Text == "shadow" {
				h.Shadow = on
			} else {
				h.ShadowHeader = on
			}

		case "reserve_output":
			o, err := option(d, func(v string) (*Handler, error) {
				n, err := strconv.ParseUint(v, 10, 63)
				if err != nil || n == 0 {
					return nil, fmt.Errorf("reserve_output must be a positive number of tokens, not %q", v)
				}
				return &Handler{ReserveOutput: int64(n)}, nil
			})
			if err != nil {
				return err
			}
			h.ReserveOutput = o.ReserveOutput

		case "body_memory":
			o, err := option(d, func(v string) (*Handler, error) {
				size, err := humanize.ParseBytes(v)
				if err != nil || size > math.MaxInt64 {
					return nil, fmt.Errorf("body_memory must be a size such as 64MiB, not %q", v)
				}
				return &Handler{BodyMemory: int64(size)}, nil
			})
			if err != nil {
				return err
			}
			h.BodyMemory = o.BodyMemory

		case "price":
			p, err := parsePrice(d)
			if err != nil {
				return err
			}
			// Handler.Validate says that a model's price is given twice;
			// this says it on the second price line.
			prices := &Handler{Prices: append(slices.Clip(h.Prices), p)}
			if _, err := prices.inlinePrices(); err != nil {
				return errAt(sub, err)
			}
			h.Prices = prices.Prices

		case "prices":
			o, err := option(d, func(v string) (*Handler, error) {
				if !strings.Contains(v, "{") { // a path with placeholders is read when the config loads
					if _, err := pricing.LoadLiteLLM(v); err != nil {
						return nil, err
					}
				}
				return &Handler{PriceFile: v}, nil
			})
			if err != nil {
				return err
			}
			h.PriceFile = o.PriceFile

		case "budget_timezone":
			o, err := option(d, func(v string) (*Handler, error) { return &Handler{BudgetTimezone: v}, nil })
			if err != nil {
				return err
			}
			h.BudgetTimezone = o.BudgetTimezone

		case "wait":
			o, err := option(d, func(v string) (*Handler, error) {
				wait, err := caddy.ParseDuration(v)
				if err != nil || wait < 0 {
					return nil, fmt.Errorf("wait must be a duration such as 2s, not %q", v)
				}
				return &Handler{Wait: caddy.Duration(wait)}, nil
			})
			if err != nil {
				return err
			}
			h.Wait = o.Wait

		case "max_waiting":
			o, err := option(d, func(v string) (*Handler, error) {
				n, err := strconv.ParseUint(v, 10, 63)
				if err != nil || n == 0 {
					return nil, fmt.Errorf("max_waiting must be a positive number of requests, not %q", v)
				}
				return &Handler{MaxWaiting: int64(n)}, nil
			})
			if err != nil {
				return err
			}
			h.MaxWaiting = o.MaxWaiting

		case "slot_lease":
			o, err := option(d, func(v string) (*Handler, error) {
				lease, err := caddy.ParseDuration(v)
				if err != nil || lease <= 0 {
					return nil, fmt.Errorf("slot_lease must be a positive duration such as 30s, not %q", v)
				}
				return &Handler{SlotLease: caddy.Duration(lease)}, nil
			})
			if err != nil {
				return err
			}
			h.SlotLease = o.SlotLease

		default:
			return d.Errf("unrecognized rolter_ratelimit subdirective '%s'", sub.Text)
		}
	}

	// A limit's scope line may come after it, so this waits for the block's
	// end, but blames the limit's own line.
	for _, l := range limitLines {
		if !declared[l.scope] {
			return errAt(l.tok, fmt.Errorf("limit for scope %q, which has no scope line", l.scope))
		}
		for _, f := range l.floors {
			if !declared[f.Scope] {
				return errAt(l.tok, fmt.Errorf("floor %s %s names scope %q, which has no scope line", f.Scope, f.ID, f.Scope))
			}
		}
	}
	if h.Top != nil {
		if err := h.Top.validate(declared); err != nil {
			return errAt(topLine, err)
		}
	}
	// So may its prices: a budget without any is blamed on the first
	// limit line with a budget.
	if len(h.Prices) == 0 && h.PriceFile == "" {
		for _, l := range limitLines {
			if l.budget {
				return errAt(l.tok, errBudgetWithoutPrice)
			}
		}
	}

	// Everything was checked line by line; this is the JSON config's check
	// of the whole, in case it learns something the lines above do not.
	if err := h.Validate(); err != nil {
		return errAt(directive, err)
	}
	return nil
}

// parseRedis parses the redis line, whose name is the current token, and its
// optional block.
func parseRedis(d *caddyfile.Dispenser) (*RedisConfig, error) {
	rc := new(RedisConfig)
	args := d.RemainingArgs()
	switch {
	case len(args) == 0:
		return nil, d.ArgErr()
	case args[0] == "cluster":
		if len(args) < 2 {
			return nil, d.Err("redis cluster needs at least one node URL")
		}
		rc.Cluster = args[1:]
	case args[0] == "sentinel":
		if len(args) < 3 {
			return nil, d.Err("redis sentinel needs a master name and at least one sentinel URL")
		}
		rc.Sentinel = &SentinelConfig{Master: args[1], URLs: args[2:]}
	case len(args) > 1:
		return nil, d.ArgErr()
	default:
		rc.URL = args[0]
	}
	if err := rc.validate(); err != nil {
		return nil, d.WrapErr(err)
	}
	seen := make(map[string]bool)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		sub := d.Token()
		if seen[sub.Text] {
			return nil, d.Errf("%s is given twice", sub.Text)
		}
		seen[sub.Text] = true
		if sub.Text == "tls" {
			if d.NextArg() {
				return nil, d.ArgErr()
			}
			rc.TLS = true
			if err := noBlock(d, sub); err != nil {
				return nil, err
			}
			continue
		}
		var v string
		if !d.AllArgs(&v) {
			return nil, d.ArgErr()
		}
		switch sub.Text {
		case "timeout":
			dur, err := caddy.ParseDuration(v)
			if err != nil {
				return nil, d.Errf("bad redis timeout %q: %v", v, err)
			}
			rc.Timeout = caddy.Duration(dur)
			if err := rc.validate(); err != nil {
				return nil, d.WrapErr(err)
			}
			if dur == 0 {
				// In JSON an absent timeout is 0; written out, 0 is a mistake.
				return nil, d.Errf("redis timeout must be positive, not %q (leave it out for the default, %s)", v, defaultTimeout)
			}
		case "pool_size":
			n, err := strconv.ParseUint(v, 10, 31)
			if err != nil || n == 0 {
				return nil, d.Errf("pool_size must be a positive integer, not %q", v)
			}
			rc.PoolSize = int(n)
		case "username":
			rc.Username = v
		case "password":
			rc.Password = v
		case "sentinel_username", "sentinel_password":
			if rc.Sentinel == nil {
				return nil, d.Errf("%s is only for redis sentinel", sub.Text)
			}
			if sub.Text == "sentinel_username" {
				rc.Sentinel.Username = v
			} else {
				rc.Sentinel.Password = v
			}
		default:
			return nil, d.Errf("unrecognized redis subdirective '%s'", sub.Text)
		}
		if err := noBlock(d, sub); err != nil {
			return nil, err
		}
	}
	return rc, nil
}

// parseScope parses the arguments of a scope line, whose name is the
// current token: the name, the value, and its options in any order, each once.
func parseScope(d *caddyfile.Dispenser) (Scope, error) {
	var s Scope
	if !d.Args(&s.Name, &s.Value) {
		return s, d.ArgErr()
	}
	seen := make(map[string]bool)
	for d.NextArg() {
		option := d.Val()
		if seen[option] {
			return s, d.Errf("%s is given twice", option)
		}
		seen[option] = true
		switch option {
		case "readable":
			s.Readable = true
		case "required":
			s.Required = true
		case "joined":
			s.Joined = true
		default:
			return s, d.Errf("unrecognized scope option '%s': expecting readable, required or joined", option)
		}
	}
	return s, nil
}

// parseRealtime parses the realtime block, whose name is the current token.
func parseRealtime(d *caddyfile.Dispenser) (*RealtimeConfig, error) {
	realtime := new(RealtimeConfig)
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	seen := make(map[string]bool)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		sub := d.Token()
		if seen[sub.Text] {
			return nil, d.Errf("%s is given twice", sub.Text)
		}
		seen[sub.Text] = true
		var v string
		if !d.AllArgs(&v) {
			return nil, d.ArgErr()
		}
		switch sub.Text {
		case "max_connections":
			n, err := strconv.ParseUint(v, 10, 63)
			if err != nil || n == 0 {
				return nil, d.Errf("max_connections must be a positive integer, not %q", v)
			}
			realtime.MaxConnections = int64(n)
		case "flush_interval":
			dur, err := caddy.ParseDuration(v)
			if err != nil || dur <= 0 {
				return nil, d.Errf("flush_interval must be a positive duration, not %q", v)
			}
			realtime.FlushInterval = caddy.Duration(dur)
		default:
			return nil, d.Errf("unrecognized realtime subdirective '%s'", sub.Text)
		}
		if err := noBlock(d, sub); err != nil {
			return nil, err
		}
	}
	return realtime, nil
}

// parsePrice parses the arguments of a price line, whose name is the
// current token: the model, then its prices in any order, each once.
func parsePrice(d *caddyfile.Dispenser) (PriceConfig, error) {
	sub := d.Token()
	var p PriceConfig
	if !d.NextArg() {
		return p, d.ArgErr()
	}
	p.Model = d.Val()
	fields := map[string]*json.Number{"input": &p.Input, "output": &p.Output, "cache_read": &p.CacheRead, "cache_write": &p.CacheWrite}
	seen := make(map[string]bool)
	for d.NextArg() {
		name := d.Val()
		f := fields[name]
		if f == nil {
			return p, d.Errf("unrecognized price option '%s': expecting input, output, cache_read or cache_write", name)
		}
		if seen[name] {
			return p, d.Errf("%s is given twice", name)
		}
		seen[name] = true
		if !d.NextArg() {
			return p, d.ArgErr()
		}
		*f = json.Number(d.Val())
	}
	if p.Input == "" || p.Output == "" {
		return p, d.Errf("price %s needs an input and an output price (US dollars per million tokens)", p.Model)
	}
	if _, err := p.entry(); err != nil {
		return p, d.WrapErr(err)
	}
	return p, noBlock(d, sub)
}

// parseFloor parses the arguments of a limit line's floor, whose name is
// the current token: floor <scope> <id> <percent>%.
func parseFloor(d *caddyfile.Dispenser) (FloorConfig, error) {
	var f FloorConfig
	var percent string
	if !d.Args(&f.Scope, &f.ID, &percent) {
		return f, d.Err("floor needs a scope, an id and a share: floor plan prod 60%")
	}
	digits, ok := strings.CutSuffix(percent, "%")
	n, err := strconv.Atoi(digits)
	if !ok || err != nil || n < 1 || n > 100 {
		return f, d.Errf("floor %s %s %s: the share kept is a whole percent from 1%% to 100%%, such as 60%%", f.Scope, f.ID, percent)
	}
	f.Percent = n
	return f, nil
}

// parseLimit parses the arguments of a limit line, whose name is the current
// token: its options in any order, each once.
func parseLimit(d *caddyfile.Dispenser) (LimitConfig, error) {
	sub := d.Token()
	var l LimitConfig
	if !d.Args(&l.Scope, &l.ID) {
		return l, d.ArgErr()
	}
	if _, err := l.resolvedID(caddy.NewReplacer()); err != nil {
		return l, d.WrapErr(err)
	}
	seen := make(map[string]bool)
	for d.NextArg() {
		name := d.Val()
		switch name {
		case "shadow", "learn":
			flag := &l.Shadow
			if name == "learn" {
				flag = &l.Learn
			}
			if *flag {
				return l, d.Errf("%s is given twice", name)
			}
			*flag = true
			continue
		case "floor":
			f, err := parseFloor(d)
			if err != nil {
				return l, err
			}
			l.Floors = append(l.Floors, f) // checked with the whole line, below
			continue
		case "notify":
			if l.Notify != nil {
				return l, d.Err("notify is given twice")
			}
			fractions, err := parseNotify(d)
			if err != nil {
				return l, err
			}
			l.Notify = fractions // checked with the whole line, below
			continue
		case "else":
			if len(l.PerRequest) > 0 {
				return l, d.Err("else is given twice, or after a cap whose value is not a placeholder")
			}
			return l, d.Err("else follows a cap whose value is a placeholder (rpm {http.request.header.X-Plan-Rpm} else 60)")
		}
		kind, ok := capKindNamed(name)
		if !ok {
			return l, d.Errf("unrecognized limit option '%s': expecting %s, or shadow, learn, floor or notify", name, capNames(", ", " or "))
		}
		if seen[name] {
			return l, d.Errf("%s is given twice", name)
		}
		seen[name] = true
		if !d.NextArg() {
			return l, d.ArgErr()
		}
		if strings.Contains(d.Val(), "{") {
			p := PerRequestCap{Value: d.Val()}
			if d.NextArg() {
				if d.Val() != "else" {
					d.Prev()
				} else if !d.NextArg() {
					return l, d.ArgErr()
				} else {
					p.Else = d.Val()
				}
			}
			if l.PerRequest == nil {
				l.PerRequest = make(map[string]PerRequestCap)
			}
			l.PerRequest[name] = p
			continue
		}
		integers, decimals := l.capFields()
		if dec := decimals[kind.index]; dec != nil { // checked with the whole line, below
			*dec = json.Number(d.Val())
			continue
		}
		// ParseUint takes neither a sign nor '_'; bit size 63 fits an int64.
		v, err := strconv.ParseUint(d.Val(), 10, 63)
		if err != nil || v == 0 {
			return l, d.Errf("%s must be a positive integer, not %q", name, d.Val())
		}
		*integers[kind.index] = int64(v)
	}
	if err := l.validate(); err != nil {
		return l, d.WrapErr(err)
	}
	return l, noBlock(d, sub)
}

// option reads the one value of an option line, whose name is the current
// token, into a handler that has only that option, built by with (whose
// error says the value cannot be read), and checks it with
// Handler.Validate, as the JSON config is checked.
func option(d *caddyfile.Dispenser, with func(string) (*Handler, error)) (*Handler, error) {
	sub := d.Token()
	var v string
	if !d.AllArgs(&v) {
		return nil, d.ArgErr()
	}
	if v == "" { // "" is JSON's "absent"; written out, it is a missing value
		return nil, d.Errf("%s needs a value", sub.Text)
	}
	o, err := with(v)
	if err == nil {
		err = o.Validate()
	}
	if err != nil {
		return nil, d.WrapErr(err)
	}
	return o, noBlock(d, sub)
}

// onOff reads the one value of an on/off option line, whose name is the
// current token.
func onOff(d *caddyfile.Dispenser) (bool, error) {
	sub := d.Token()
	var v string
	if !d.AllArgs(&v) {
		return false, d.ArgErr()
	}
	if v != "on" && v != "off" {
		return false, d.Errf("%s must be on or off, not %q", sub.Text, v)
	}
	return v == "on", noBlock(d, sub)
}

// noBlock reports a block opened after the line of sub, which takes none.
// (An empty "{}" on the same line is consumed without a word, as everywhere
// in Caddy's dispenser.)
func noBlock(d *caddyfile.Dispenser, sub caddyfile.Token) error {
	if d.NextBlock(d.Nesting()) {
		return errAt(sub, fmt.Errorf("%s takes no block", sub.Text))
	}
	return nil
}

// errAt wraps err with tok's file and line (and import chain), exactly as
// Dispenser.WrapErr would have done with tok as the current token.
func errAt(tok caddyfile.Token, err error) error {
	d := caddyfile.NewDispenser([]caddyfile.Token{tok})
	d.Next()
	return d.WrapErr(err)
}

// Interface guard
var _ caddyfile.Unmarshaler = (*Handler)(nil)
