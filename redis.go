package ratelimit

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
)

// RedisConfig locates the Redis deployment that holds the shared counters:
// one server (URL), a Redis Cluster (Cluster), or a primary found through
// Sentinel (Sentinel). Exactly one of them is set.
type RedisConfig struct {
	// URL is one server: redis://, rediss:// or unix://, as go-redis parses it.
	URL string `json:"url,omitempty"`
	// Cluster lists seed nodes of a Redis Cluster, as redis:// or rediss://
	// URLs. Every key of a request's chain then carries the chain root's hash
	// tag, so that the admission stays one script on one shard.
	Cluster []string `json:"cluster,omitempty"`
	// Sentinel finds the primary through Redis Sentinel.
	Sentinel *SentinelConfig `json:"sentinel,omitempty"`

	// Timeout bounds one admission, dial and replay included, so that a
	// stalled Redis costs a request at most this long before on_redis_error
	// applies. It also bounds a token charge's call, and Sentinel queries.
	// Default 100ms.
	Timeout caddy.Duration `json:"timeout,omitempty"`
	// PoolSize is the most connections per node. Default: go-redis's, 10 per CPU.
	PoolSize int `json:"pool_size,omitempty"`
	// Username and Password authenticate to the data nodes (placeholders
	// such as {env.REDIS_PASSWORD} are resolved when the config loads). They
	// override credentials in the URLs.
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
	// TLS connects with TLS even to redis:// URLs (rediss:// always does).
	TLS bool `json:"tls,omitempty"`
}

// SentinelConfig names the primary that a set of sentinels watch.
type SentinelConfig struct {
	// Master is the name the sentinels monitor.
	Master string `json:"master"`
	// URLs are the sentinels' addresses, as redis:// URLs; the first one's
	// database number selects the database on the primary.
	URLs []string `json:"urls"`
	// Username and Password authenticate to the sentinels themselves.
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
}

func (c *RedisConfig) validate() error {
	set := 0
	for _, ok := range []bool{c.URL != "", len(c.Cluster) > 0, c.Sentinel != nil} {
		if ok {
			set++
		}
	}
	if set != 1 {
		return errors.New("redis needs exactly one of a URL, cluster URLs or a sentinel")
	}
	if c.Sentinel != nil && (c.Sentinel.Master == "" || len(c.Sentinel.URLs) == 0) {
		return errors.New("redis sentinel needs a master name and at least one sentinel URL")
	}
	if c.Timeout < 0 {
		return errors.New("redis timeout must not be negative")
	}
	if c.PoolSize < 0 {
		return errors.New("redis pool_size must not be negative")
	}
	var repl *caddy.Replacer
	for _, u := range c.deployment().URLs() {
		if u == "" {
			return errors.New("redis needs a URL")
		}
		if strings.Contains(u, "{") {
			// A placeholder, resolved and parsed in Provision; one that is
			// known now and leaves the URL empty (an unset {env.*}) fails
			// here, where the Caddyfile still has its line.
			if repl == nil {
				repl = caddy.NewReplacer()
			}
			if _, err := resolvedURL(repl, u); err != nil {
				return err
			}
			continue
		}
		if _, err := limiter.ParseRedisURL(u); err != nil {
			return err
		}
	}
	return nil
}

// resolved returns the config with its placeholders replaced; a URL they
// leave empty is an error (resolvedURL).
func (c *RedisConfig) resolved(repl *caddy.Replacer) (*RedisConfig, error) {
	r := *c
	var err error
	if r.URL, err = resolvedURL(repl, c.URL); err != nil {
		return nil, err
	}
	if r.Cluster, err = resolvedURLs(repl, c.Cluster); err != nil {
		return nil, err
	}
	if c.Sentinel != nil {
		s := *c.Sentinel
		if s.URLs, err = resolvedURLs(repl, c.Sentinel.URLs); err != nil {
			return nil, err
		}
		s.Username, s.Password = repl.ReplaceKnown(s.Username, ""), repl.ReplaceKnown(s.Password, "")
		r.Sentinel = &s
	}
	r.Username, r.Password = repl.ReplaceKnown(c.Username, ""), repl.ReplaceKnown(c.Password, "")
	return &r, nil
}

// resolvedURLs is resolvedURL of each of urls.
func resolvedURLs(repl *caddy.Replacer, urls []string) ([]string, error) {
	out := make([]string, len(urls))
	for i, u := range urls {
		var err error
		if out[i], err = resolvedURL(repl, u); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// resolvedURL is the URL u with the placeholders repl knows replaced. A URL
// that they leave empty, such as {env.REDIS_URL} with REDIS_URL unset, is an
// error that says so and names the variables, where parsing "" could only
// say that it cannot be parsed. The error repeats u, which then holds
// nothing but placeholders, so no password.
func resolvedURL(repl *caddy.Replacer, u string) (string, error) {
	r := repl.ReplaceKnown(u, "")
	if r != "" || u == "" {
		return r, nil
	}
	msg := fmt.Sprintf("redis URL %q is empty after placeholders", u)
	var vars []string
	for _, m := range envPlaceholder.FindAllStringSubmatch(u, -1) {
		vars = append(vars, m[1])
	}
	if len(vars) > 0 {
		msg += fmt.Sprintf(": is %s set?", strings.Join(vars, " or "))
	}
	return "", errors.New(msg)
}

// envPlaceholder matches an {env.NAME} placeholder, NAME its submatch.
var envPlaceholder = regexp.MustCompile(`\{env\.([^{}]+)\}`)

// poolKey identifies the client a resolved config needs; configs with the
// same key share one.
func (c *RedisConfig) poolKey(timeout time.Duration) string {
	s := ""
	if c.Sentinel != nil {
		s = fmt.Sprintf("%q", *c.Sentinel)
	}
	return fmt.Sprintf("redis|%q|%q|%s|%s|%d|%q|%q|%t", c.URL, c.Cluster, s, timeout, c.PoolSize, c.Username, c.Password, c.TLS)
}

// deployment is the Redis of a resolved config, as the store takes it.
func (c *RedisConfig) deployment() *limiter.RedisDeployment {
	d := &limiter.RedisDeployment{URL: c.URL, Cluster: c.Cluster, PoolSize: c.PoolSize, Username: c.Username, Password: c.Password, TLS: c.TLS}
	if c.Sentinel != nil {
		d.Sentinel = &limiter.RedisSentinel{Master: c.Sentinel.Master, URLs: c.Sentinel.URLs, Username: c.Sentinel.Username, Password: c.Sentinel.Password}
	}
	return d
}
