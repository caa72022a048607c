package ratelimit

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

var (
	//go:embed admit.lua
	admitLua    string
	admitScript = redis.NewScript(admitLua)

	//go:embed record.lua
	recordLua    string
	recordScript = redis.NewScript(recordLua)
)

// redisStore keeps the counters in Redis, shared by every replica. Each
// admission is one EVALSHA of admit.lua (go-redis's Script loads the script
// and retries on NOSCRIPT, as after a Redis restart).
type redisStore struct {
	lifetime
	client  *redis.Client
	opts    *redis.Options // for the replay's fresh connection
	timeout time.Duration
}

// redisStores shares a client among the handlers of every loaded config with
// the same settings, so that a reload neither reconnects nor leaks a pool.
var redisStores = caddy.NewUsagePool()

func acquireRedisStore(url string, timeout time.Duration) (store, func() error, error) {
	key := "redis\x00" + url + "\x00" + timeout.String()
	v, _, err := redisStores.LoadOrNew(key, func() (caddy.Destructor, error) {
		return newRedisStore(url, timeout)
	})
	if err != nil {
		return nil, nil, err
	}
	return v.(*redisStore), func() error {
		_, err := redisStores.Delete(key)
		return err
	}, nil
}

func newRedisStore(url string, timeout time.Duration) (*redisStore, error) {
	opts, err := parseRedisURL(url)
	if err != nil {
		return nil, err
	}
	// go-redis must not retry behind our back: a lost reply would run the
	// (non-idempotent) script again. The one replay is ours (admit).
	opts.MaxRetries = -1
	// Fail fast while Redis is down: one dial attempt, and every read, write,
	// dial and wait for a pooled connection bounded by the admission timeout.
	opts.DialerRetries = 1
	opts.DialTimeout = timeout
	opts.ReadTimeout = timeout
	opts.WriteTimeout = timeout
	opts.PoolTimeout = timeout
	opts.ContextTimeoutEnabled = true
	// No extra handshake commands on each new connection.
	opts.DisableIdentity = true
	opts.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	return &redisStore{client: redis.NewClient(opts), opts: opts, timeout: timeout}, nil
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

func (c *RedisConfig) validate() error {
	if c.URL == "" {
		return errors.New("redis needs a URL")
	}
	if c.Timeout < 0 {
		return errors.New("redis timeout must not be negative")
	}
	if strings.Contains(c.URL, "{") {
		return nil // a placeholder, resolved and checked in Provision
	}
	_, err := parseRedisURL(c.URL)
	return err
}

// Destruct closes the client once no loaded config uses it and no admitted
// response or session of an old config still has tokens to charge.
func (s *redisStore) Destruct() error {
	s.unload(s.closeClient)
	return nil
}

func (s *redisStore) closeClient() { s.client.Close() }

func (s *redisStore) release() { s.lifetime.release(s.closeClient) }

func (s *redisStore) admit(ctx context.Context, chain []limit, atMillis int64) (decision, error) {
	return s.run(ctx, chain, atMillis, false)
}

func (s *redisStore) peek(ctx context.Context, chain []limit, atMillis int64) (decision, error) {
	return s.run(ctx, chain, atMillis, true)
}

// run runs admit.lua, which only reads when peek is set.
func (s *redisStore) run(ctx context.Context, chain []limit, atMillis int64, peek bool) (decision, error) {
	keys := make([]string, len(chain))
	args := make([]any, 1+2*len(chain), 2+2*len(chain))
	args[0] = clockArg(atMillis)
	for i, l := range chain {
		keys[i] = l.prefix
		args[1+2*i] = l.rpm
		args[2+2*i] = l.tpm
	}
	if peek {
		args = append(args, "peek")
	}
	op := "admit"
	if peek {
		op = "peek"
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	reply, err := admitScript.Run(ctx, s.client, keys, args...).Int64Slice()
	if isDeadConnection(err) {
		// Admission is the one write that is replayed, once, on a fresh
		// connection: usually the first attempt never reached Redis. If it
		// did and only the reply was lost, the replay errs by one request
		// towards stricter, in a bucket that expires within two minutes.
		reply, err = s.replay(ctx, keys, args)
	}
	observeRedis(op, start, err)
	if err != nil {
		return decision{}, err
	}
	return decodeAdmission(reply, len(chain))
}

// replay runs the admission once more on a connection dialled for it, since
// the pool's other idle connections may have died the same way.
func (s *redisStore) replay(ctx context.Context, keys []string, args []any) ([]int64, error) {
	opts := *s.opts
	opts.PoolSize = 1
	opts.MaxIdleConns = 1
	fresh := redis.NewClient(&opts)
	defer fresh.Close()
	return admitScript.Run(ctx, fresh, keys, args...).Int64Slice()
}

// isDeadConnection reports an error of a connection that the server or the
// network closed, as opposed to a timeout (the script may be running).
func isDeadConnection(err error) bool {
	if err == nil {
		return false
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, net.ErrClosed)
}

func decodeAdmission(reply []int64, n int) (decision, error) {
	if len(reply) != 2+4*n || reply[0] != 0 && reply[0] != 1 {
		return decision{}, fmt.Errorf("%w: admission reply of %d values for %d limits", errBadReply, len(reply), n)
	}
	d := decision{admitted: reply[0] == 1, now: momentAt(reply[1]), counts: make([]counts, n)}
	for i := range d.counts {
		r := reply[2+4*i:]
		d.counts[i] = counts{req: window{cur: r[0], prev: r[1]}, tok: window{cur: r[2], prev: r[3]}}
	}
	return d, nil
}

func (s *redisStore) recordTokens(ctx context.Context, chain []limit, tokens, atMillis int64) error {
	if tokens <= 0 {
		return nil
	}
	var keys []string
	for _, l := range chain {
		if l.tpm > 0 {
			keys = append(keys, l.prefix)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	err := recordScript.Run(ctx, s.client, keys, clockArg(atMillis), tokens).Err()
	observeRedis("record_tokens", start, err)
	return err
}

// clockArg is the scripts' clock argument: "" for Redis TIME.
func clockArg(atMillis int64) string {
	if atMillis == 0 {
		return ""
	}
	return strconv.FormatInt(atMillis, 10)
}

// Interface guards
var (
	_ store            = (*redisStore)(nil)
	_ caddy.Destructor = (*redisStore)(nil)
)
