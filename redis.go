package ratelimit

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
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

// topology is how a Redis deployment is reached.
type topology uint8

const (
	singleNode topology = iota
	cluster
	sentinel
)

func (c *RedisConfig) topology() topology {
	switch {
	case len(c.Cluster) > 0:
		return cluster
	case c.Sentinel != nil:
		return sentinel
	}
	return singleNode
}

// urls are the configured addresses of whatever topology.
func (c *RedisConfig) urls() []string {
	switch c.topology() {
	case cluster:
		return c.Cluster
	case sentinel:
		return c.Sentinel.URLs
	}
	return []string{c.URL}
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
	for _, u := range c.urls() {
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
		if _, err := parseRedisURL(u); err != nil {
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

// where says where a resolved config keeps its counters, without
// credentials: configs that say the same share their counters.
func (c *RedisConfig) where() string {
	var addrs []string
	db := 0
	for _, u := range c.urls() {
		o, err := parseRedisURL(u)
		if err != nil {
			return "invalid URL"
		}
		addr := o.Addr
		if o.Network == "unix" {
			addr = "unix:" + addr
		}
		addrs = append(addrs, addr)
		if len(addrs) == 1 {
			db = o.DB
		}
	}
	switch c.topology() {
	case cluster:
		return "cluster " + strings.Join(addrs, ",")
	case sentinel:
		return fmt.Sprintf("sentinel %s %s/%d", c.Sentinel.Master, strings.Join(addrs, ","), db)
	}
	scheme := "redis"
	if c.TLS || strings.HasPrefix(c.URL, "rediss:") {
		scheme = "rediss"
	}
	return fmt.Sprintf("%s://%s/%d", scheme, addrs[0], db)
}

// newClient builds the go-redis client of a resolved config. go-redis's
// defaults differ between its clients; every option that decides our
// guarantees is set here explicitly for each of them:
//   - no retries behind our back: a lost reply would run the (non-idempotent)
//     script again. The single-node and Sentinel clients get MaxRetries -1
//     and our one replay (redisStore.runScript). The cluster client's MaxRetries
//     -1 also turns retries off, but it resends a command once by itself
//     within its redirect budget (EOF, timeouts, TRYAGAIN, CLUSTERDOWN); with
//     MaxRedirects 1 that is at most one resend, which then stands in for our
//     replay (see redisStore.runScript).
//   - one dial attempt, and dial, read, write and pool waits bounded by the
//     admission timeout, so that fail-open is fast while Redis is down;
//   - no identity or maintenance-notification handshake on new connections.
func (c *RedisConfig) newClient(timeout time.Duration) (redis.UniversalClient, error) {
	first, err := parseRedisURL(c.urls()[0])
	if err != nil {
		return nil, err
	}
	tlsConfig := first.TLSConfig
	if c.TLS && tlsConfig == nil {
		host, _, _ := net.SplitHostPort(first.Addr)
		tlsConfig = &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12}
	}
	username, password := first.Username, first.Password
	if c.Username != "" || c.Password != "" {
		username, password = c.Username, c.Password
	}
	noHandshake := &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	switch c.topology() {
	case cluster:
		addrs, err := addrsOf(c.Cluster)
		if err != nil {
			return nil, err
		}
		return redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: addrs, Username: username, Password: password, TLSConfig: tlsConfig,
			MaxRetries: -1, MaxRedirects: 1,
			DialerRetries: 1, DialTimeout: timeout, ReadTimeout: timeout, WriteTimeout: timeout, PoolTimeout: timeout,
			ContextTimeoutEnabled: true, PoolSize: c.PoolSize,
			DisableIdentity: true, MaintNotificationsConfig: noHandshake,
		}), nil
	case sentinel:
		addrs, err := addrsOf(c.Sentinel.URLs)
		if err != nil {
			return nil, err
		}
		return redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName: c.Sentinel.Master, SentinelAddrs: addrs,
			SentinelUsername: c.Sentinel.Username, SentinelPassword: c.Sentinel.Password,
			Username: c.Username, Password: c.Password, DB: first.DB, TLSConfig: tlsConfig,
			MaxRetries:    -1,
			DialerRetries: 1, DialTimeout: timeout, ReadTimeout: timeout, WriteTimeout: timeout, PoolTimeout: timeout,
			ContextTimeoutEnabled: true, PoolSize: c.PoolSize,
			DisableIdentity: true, // go-redis has no maintenance notifications for it
		}), nil
	}
	first.Username, first.Password, first.TLSConfig = username, password, tlsConfig
	first.MaxRetries = -1
	first.DialerRetries = 1
	first.DialTimeout, first.ReadTimeout, first.WriteTimeout, first.PoolTimeout = timeout, timeout, timeout, timeout
	first.ContextTimeoutEnabled = true
	if c.PoolSize > 0 {
		first.PoolSize = c.PoolSize
	}
	first.DisableIdentity = true
	first.MaintNotificationsConfig = noHandshake
	return redis.NewClient(first), nil
}

func addrsOf(urls []string) ([]string, error) {
	addrs := make([]string, len(urls))
	for i, u := range urls {
		opts, err := parseRedisURL(u)
		if err != nil {
			return nil, err
		}
		addrs[i] = opts.Addr
	}
	return addrs, nil
}

// parseRedisURL parses a Redis URL without repeating it (it may hold a
// password) in its error.
func parseRedisURL(url string) (*redis.Options, error) {
	opts, err := redis.ParseURL(url)
	if err != nil {
		msg := err.Error()
		if strings.Contains(msg, url) {
			msg = "cannot parse it"
		}
		return nil, fmt.Errorf("invalid redis URL (redis://, rediss:// or unix://): %s", msg)
	}
	return opts, nil
}
