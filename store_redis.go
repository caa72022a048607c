package ratelimit

import (
	"context"
	_ "embed"
	"errors"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
)

var (
	//go:embed admit.lua
	admitLua    string
	admitScript = redis.NewScript(admitLua)
)

// redisStore keeps the counters in Redis, shared by every replica. Each
// admission and each token charge is part of one EVALSHA of admit.lua
// (go-redis's Script loads the script and retries on NOSCRIPT, as after a
// Redis restart or a failover).
type redisStore struct {
	lifetime
	client  redis.UniversalClient
	config  *RedisConfig // resolved: for the replay's fresh connection
	timeout time.Duration
	// calls coalesces concurrent admissions and charges (coalesce.go); nil
	// on Redis Cluster, where a call is bound to one slot.
	calls *coalescer[*scriptItem]
	// refusals is shared by every handler of the store, across reloads.
	refusals *refusalCache
}

// The coalescer's calls of admit.lua in flight at once, and how long a token
// charge waits to ride in a call that admits before it makes its own: charges
// are made after their response, so a millisecond costs no client anything.
// One call in flight makes the calls half as many as two did, and took a
// fifth less of Redis's CPU per request through Caddy, at the same
// throughput and latency (bench/run's chain, alternated runs): a call's
// fixed cost is most of Redis's. A lone request still goes at once; under
// load a request waits for at most the call in flight, then goes in the next.
const (
	callsInFlight = 1
	chargeLinger  = time.Millisecond
)

// redisStores shares a client among the handlers of every loaded config with
// the same settings, so that a reload neither reconnects nor leaks a pool.
var redisStores = caddy.NewUsagePool()

// acquireRedisStore takes the store of a resolved config from the pool.
func acquireRedisStore(config *RedisConfig, timeout time.Duration) (store, func() error, error) {
	key := config.poolKey(timeout)
	v, _, err := redisStores.LoadOrNew(key, func() (caddy.Destructor, error) {
		return newRedisStore(config, timeout)
	})
	if err != nil {
		return nil, nil, err
	}
	return v.(*redisStore), func() error {
		_, err := redisStores.Delete(key)
		return err
	}, nil
}

func newRedisStore(config *RedisConfig, timeout time.Duration) (*redisStore, error) {
	client, err := config.newClient(timeout)
	if err != nil {
		return nil, err
	}
	s := &redisStore{client: client, config: config, timeout: timeout, refusals: newRefusalCache()}
	if config.topology() != cluster {
		s.calls = newCoalescer(callsInFlight, chargeLinger, func(first *scriptItem) batch[*scriptItem] {
			b := &scriptBatch{store: s}
			b.add(first)
			return b
		})
	}
	return s, nil
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
	if s.calls != nil {
		return s.admitCoalesced(ctx, chain, atMillis)
	}
	return s.run(ctx, chain, atMillis, false)
}

func (s *redisStore) peek(ctx context.Context, chain []limit, atMillis int64) (decision, error) {
	return s.run(ctx, chain, atMillis, true)
}

// run decides one admission with admit.lua, which only reads when peek is
// set.
func (s *redisStore) run(ctx context.Context, chain []limit, atMillis int64, peek bool) (decision, error) {
	var c scriptCall
	c.add(chain)
	ds, _, err := s.call(ctx, &c, atMillis, peek)
	if err != nil {
		return decision{}, err
	}
	return ds[0], nil
}

// call runs admit.lua once for the admissions and token charges of c, and
// returns the admissions' decisions and the charges' outcome. A charge is
// never replayed (a double charge would outlive the failure): when a call
// that charges meets a dead connection, its charges fail with that error and
// its admissions are replayed alone.
func (s *redisStore) call(ctx context.Context, c *scriptCall, atMillis int64, peek bool) (ds []decision, charged, err error) {
	op := "admit"
	switch {
	case peek:
		op = "peek"
	case len(c.chains) == 0:
		op = "record_tokens"
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	charging := len(c.charges.prefixes) > 0
	bucket := s.bucketFor(atMillis)
	reply, err := s.runScript(ctx, admitScript, c.keys(bucket), c.args(atMillis, bucket, peek), !charging)
	if b, ok := otherBucket(reply); ok && err == nil {
		// Redis's clock is in another minute than ours: nothing ran; name
		// the keys of its bucket.
		bucket = b
		reply, err = s.runScript(ctx, admitScript, c.keys(bucket), c.args(atMillis, bucket, peek), !charging)
	}
	if charging && len(c.chains) > 0 && s.config.topology() != cluster && isDeadConnection(err) {
		charged, c.charges = err, chargeCall{}
		reply, err = s.replay(ctx, admitScript, c.keys(bucket), c.args(atMillis, bucket, peek))
	}
	observeRedis(op, start, err)
	if err != nil {
		return nil, err, err
	}
	ds, err = c.decode(reply, !peek)
	if charged == nil {
		charged = err
	}
	return ds, charged, err
}

// bucketFor is the bucket that names a call's keys: the pinned clock's, or
// the gateway's. The script checks it against its own clock.
func (s *redisStore) bucketFor(atMillis int64) int64 {
	if atMillis == 0 {
		atMillis = time.Now().UnixMilli()
	}
	return momentAt(atMillis).bucket
}

// otherBucket reads the scripts' answer {-1, now}: the keys named another
// bucket than Redis's clock, and nothing ran.
func otherBucket(reply []int64) (int64, bool) {
	if len(reply) != 2 || reply[0] != -1 {
		return 0, false
	}
	return momentAt(reply[1]).bucket, true
}

// runScript runs a script; only an admission may be replayed. An admission
// is executed at most twice in all
// (a send answered by NOSCRIPT, MOVED, ASK or TRYAGAIN did not run it):
//   - single node and Sentinel: go-redis does not retry (MaxRetries -1), and
//     an attempt that meets a dead connection is replayed once, by us, on a
//     fresh one: usually the first attempt never reached Redis. If it did and
//     only the reply was lost, the replay errs by one request towards
//     stricter, in a bucket that expires within two minutes.
//   - cluster: the client follows one MOVED or ASK, or resends once after a
//     dead connection, a timeout, TRYAGAIN or CLUSTERDOWN (MaxRedirects 1),
//     which stands in for our replay; we add none. A multi-key script in a
//     slot that is migrating gets TRYAGAIN (it did not run): that is retried
//     briefly, within the admission timeout, then handled like an outage.
func (s *redisStore) runScript(ctx context.Context, script *redis.Script, keys []string, args []any, replay bool) ([]int64, error) {
	if s.config.topology() == cluster {
		for {
			reply, err := script.Run(ctx, s.client, keys, args...).Int64Slice()
			if !redis.IsTryAgainError(err) {
				return reply, err
			}
			select {
			case <-ctx.Done():
				return nil, err
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	reply, err := script.Run(ctx, s.client, keys, args...).Int64Slice()
	if replay && isDeadConnection(err) {
		reply, err = s.replay(ctx, script, keys, args)
	}
	return reply, err
}

// replay runs the admission once more on a connection dialled for it, since
// the pool's other idle connections may have died the same way.
func (s *redisStore) replay(ctx context.Context, script *redis.Script, keys []string, args []any) ([]int64, error) {
	config := *s.config
	config.PoolSize = 1
	fresh, err := config.newClient(s.timeout)
	if err != nil {
		return nil, err
	}
	defer fresh.Close()
	return script.Run(ctx, fresh, keys, args...).Int64Slice()
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

func (s *redisStore) recordTokens(ctx context.Context, chain []limit, tokens, atMillis int64) error {
	if tokens <= 0 || !chainHasTPM(chain) {
		return nil
	}
	if s.calls != nil {
		charged := make(chan error, 1)
		s.calls.ride(&scriptItem{chain: chain, tokens: tokens, atMillis: atMillis, charged: func(err error) { charged <- err }})
		select {
		case err := <-charged:
			return err
		case <-ctx.Done():
			return ctx.Err() // it may still be charged
		}
	}
	var c scriptCall
	c.charges.add(chain, tokens)
	_, charged, _ := s.call(ctx, &c, atMillis, false)
	return charged
}

// chargeLater rides in the coalescer's calls; on Redis Cluster, where calls
// are not coalesced, it charges in a goroutine of its own.
func (s *redisStore) chargeLater(chain []limit, tokens int64, done func(error)) {
	if tokens <= 0 || !chainHasTPM(chain) {
		done(nil)
		return
	}
	if s.calls != nil {
		s.calls.ride(&scriptItem{chain: chain, tokens: tokens, charged: done})
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
		defer cancel()
		done(s.recordTokens(ctx, chain, tokens, 0))
	}()
}

// Interface guards
var (
	_ store            = (*redisStore)(nil)
	_ caddy.Destructor = (*redisStore)(nil)
)
