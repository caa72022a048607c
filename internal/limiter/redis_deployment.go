package limiter

import (
	"crypto/tls"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// RedisDeployment is the Redis that holds a store's counters, as the
// module's configuration resolved it: one server (URL), a Redis Cluster
// (Cluster) or a primary found through Sentinel (Sentinel).
type RedisDeployment struct {
	URL      string
	Cluster  []string
	Sentinel *RedisSentinel
	// PoolSize is the most connections per node; 0 is go-redis's default.
	PoolSize int
	// Username and Password authenticate to the data nodes, over those of
	// the URLs.
	Username, Password string
	// TLS connects with TLS even to redis:// URLs.
	TLS bool
}

// RedisSentinel names the primary that a set of sentinels watch.
type RedisSentinel struct {
	Master             string
	URLs               []string
	Username, Password string
}

// topology is how a Redis deployment is reached.
type topology uint8

const (
	singleNode topology = iota
	cluster
	sentinel
)

func (c *RedisDeployment) topology() topology {
	switch {
	case len(c.Cluster) > 0:
		return cluster
	case c.Sentinel != nil:
		return sentinel
	}
	return singleNode
}

// URLs are the configured addresses of whatever topology.
func (c *RedisDeployment) URLs() []string {
	switch c.topology() {
	case cluster:
		return c.Cluster
	case sentinel:
		return c.Sentinel.URLs
	}
	return []string{c.URL}
}

// Where says where a resolved config keeps its counters, without
// credentials: configs that say the same share their counters.
func (c *RedisDeployment) Where() string {
	var addrs []string
	db := 0
	for _, u := range c.URLs() {
		o, err := ParseRedisURL(u)
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
//     and our one replay (RedisStore.runScript). The cluster client's MaxRetries
//     -1 also turns retries off, but it resends a command once by itself
//     within its redirect budget (EOF, timeouts, TRYAGAIN, CLUSTERDOWN); with
//     MaxRedirects 1 that is at most one resend, which then stands in for our
//     replay (see RedisStore.runScript).
//   - one dial attempt, and dial, read, write and pool waits bounded by the
//     admission timeout, so that fail-open is fast while Redis is down;
//   - no identity or maintenance-notification handshake on new connections.
func (c *RedisDeployment) newClient(timeout time.Duration) (redis.UniversalClient, error) {
	first, err := ParseRedisURL(c.URLs()[0])
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
	// RESP2 unless the URL asks for another: every reply the store reads
	// has the same shape in both, and on RESP3 go-redis looks for push
	// notifications, which nothing here subscribes to, around every call.
	protocol := first.Protocol
	if protocol == 0 {
		protocol = 2
	}
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
			ContextTimeoutEnabled: true, PoolSize: c.PoolSize, Protocol: protocol,
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
			ContextTimeoutEnabled: true, PoolSize: c.PoolSize, Protocol: protocol,
			DisableIdentity: true, // go-redis has no maintenance notifications for it
		}), nil
	}
	first.Username, first.Password, first.TLSConfig = username, password, tlsConfig
	first.MaxRetries = -1
	first.DialerRetries = 1
	first.DialTimeout, first.ReadTimeout, first.WriteTimeout, first.PoolTimeout = timeout, timeout, timeout, timeout
	first.ContextTimeoutEnabled = true
	first.Protocol = protocol
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
		opts, err := ParseRedisURL(u)
		if err != nil {
			return nil, err
		}
		addrs[i] = opts.Addr
	}
	return addrs, nil
}

// ParseRedisURL parses a Redis URL without repeating it (it may hold a
// password) in its error.
func ParseRedisURL(url string) (*redis.Options, error) {
	opts, err := redis.ParseURL(url)
	if err != nil {
		msg := err.Error()
		if strings.Contains(msg, url) {
			msg = "cannot parse it"
		}
		return nil, fmt.Errorf("invalid redis URL (redis://, rediss:// or unix://): %s", msg)
	}
	// go-redis takes any number, and a server then refuses the handshake at
	// every connection: the store would fail each call, not the config.
	if opts.Protocol != 0 && opts.Protocol != 2 && opts.Protocol != 3 {
		return nil, fmt.Errorf("invalid redis URL: protocol %d: RESP2 or RESP3 (protocol=2 or protocol=3)", opts.Protocol)
	}
	return opts, nil
}
