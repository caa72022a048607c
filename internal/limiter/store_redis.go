package limiter

import (
	"context"
	"crypto/rand"
	_ "embed"
	"errors"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/semaphore"

	"github.com/rolter/caddy-ratelimit/internal/coalesce"
)

var (
	//go:embed admit.lua
	admitLua    string
	admitScript = redis.NewScript(admitLua)
)

// RedisStore keeps the counters in Redis, shared by every replica. Each
// admission and each token charge is part of one EVALSHA of admit.lua,
// which sends the script's source once Redis answers NOSCRIPT, as after a
// Redis restart or a failover (evalSha; go-redis's Script.Run on Cluster).
type RedisStore struct {
	lifetime
	clock   RedisClock
	client  redis.UniversalClient
	config  *RedisDeployment // for the replay's fresh connection
	timeout time.Duration
	// calls coalesces concurrent admissions and charges (scriptBatch); nil
	// on Redis Cluster, where a call is bound to one slot.
	calls *coalesce.Coalescer[*scriptItem]
	// refusals answers what Redis refused, until Redis would admit again
	// (refusalcache.go); shared by every handler of the store, across reloads.
	refusals *refusalCache
	// holder names this store's slots in Redis: random, one per store, so
	// that each process is its own holder (slots.go).
	holder string
	// held is the ledger of the slots this store holds, which the renewal
	// writes. Every call that takes or frees slots holds a unit of
	// slotCalls from before it is sent until the ledger counts it, and a
	// renewal holds them all: the renewal's counts are then exactly what
	// Redis holds once every call before it has run. (A semaphore rather
	// than a lock, so that an admission waits for a renewal within its
	// timeout.)
	held      *heldSlots
	slotCalls *semaphore.Weighted
	// freed ends a free, whatever its outcome (a failure is observed, and
	// mended by the renewal): it releases the store that the admission held
	// for it. Made once, as every free's callback.
	freed func(error)
	// batches are the coalesced calls' batches, kept between calls with
	// their slices' and maps' room, which a call of many admissions
	// otherwise grows anew.
	batches  sync.Pool
	stop     chan struct{}
	renewing sync.WaitGroup
	// reports coalesces the reports of each set of learned keys
	// (reportQueue).
	reports reportQueue
	// tallies are the top consumers' additions not yet sent, which
	// tallySent says a send of them is scheduled (top.go).
	tallies   tallies
	tallySent atomic.Bool
}

// slotCallsMax is more calls than are ever in flight at once: a renewal
// takes it whole.
const slotCallsMax = 1 << 30

// The coalescer's calls of admit.lua in flight at once, and how long a token
// charge waits to ride in a call that admits before it makes its own: charges
// are made after their response, so a millisecond costs no client anything.
// One call in flight: a call's fixed cost is most of Redis's, so fewer and
// fuller calls cost it less, and a lone request still goes at once; under
// load a request waits for at most the call in flight, then goes in the next.
const (
	callsInFlight = 1
	chargeLinger  = time.Millisecond
)

// redisClock is where a Redis store reads the time: the gateway's clock,
// which names the keys of a call (the script checks them against its own)
// and whose monotonic reading bounds Redis's in the refusal cache; and the
// clock admit.lua reads, as the script's clock argument at a reading of the
// gateway's.
type RedisClock struct {
	Gateway func() time.Time
	Script  func(gateway time.Time) string
}

// systemRedisClock is this machine's clock, and Redis TIME (the argument
// ""), so that replicas whose clocks are skewed agree on Redis's.
var SystemRedisClock = RedisClock{Gateway: time.Now, Script: func(time.Time) string { return "" }}

// newRedisStore is a store of the resolved config that reads the time from
// clock.
func NewRedisStore(config *RedisDeployment, timeout time.Duration, clock RedisClock) (*RedisStore, error) {
	client, err := config.newClient(timeout)
	if err != nil {
		return nil, err
	}
	s := &RedisStore{clock: clock, client: client, config: config, timeout: timeout, refusals: newRefusalCache(), reports: reportQueue{waiting: make(map[string]*waitingReport)},
		holder: rand.Text(), held: newHeldSlots(), slotCalls: semaphore.NewWeighted(slotCallsMax), stop: make(chan struct{})}
	s.freed = func(error) { s.Release() }
	if config.topology() != cluster {
		s.batches.New = func() any { return &scriptBatch{store: s, pooled: true} }
		s.calls = coalesce.New(callsInFlight, chargeLinger, func(first *scriptItem) coalesce.Batch[*scriptItem] {
			b := s.batches.Get().(*scriptBatch)
			b.Add(first)
			return b
		})
	}
	return s, nil
}

// Destruct closes the client once no loaded config uses it and no admitted
// response or session of an old config still has tokens to charge.
func (s *RedisStore) Destruct() error {
	s.unload(s.closeClient)
	return nil
}

func (s *RedisStore) closeClient() {
	close(s.stop)
	s.renewing.Wait()
	s.sendTallies()
	s.client.Close()
}

// StartRenewal renews the slots the store holds while it holds any, until
// its client closes.
func (s *RedisStore) StartRenewal() {
	s.renewing.Go(func() { s.held.renewEvery(s.renew, s.stop) })
}

func (s *RedisStore) Describe() storeDescription {
	return storeDescription{Kind: "redis", Where: s.config.Where(), Tagged: s.config.topology() == cluster}
}

func (s *RedisStore) Release() { s.lifetime.release(s.closeClient) }

//go:embed reset.lua
var resetLua string

var resetScript = redis.NewScript(resetLua)

// reset deletes l's window keys in the periods around the gateway's clock
// and its bucket's key, and writes when in its reset key if it caps a token
// window, in one call of reset.lua: every key of a limit shares its
// prefix, and on Redis Cluster its hash tag, so they are in one slot. It
// keeps the slots and budget keys (the admin API's reset). Then, whatever became of the
// call (a timeout may hide one that ran), it forgets this process's cached
// refusals of l, and any refusal of an admission sent before that.
func (s *RedisStore) Reset(ctx context.Context, l Limit) ([]string, error) {
	defer s.refusals.forgetLimit(l.Prefix)
	now := s.clock.Gateway()
	keys := resetKeys(l, MomentAt(now.UnixMilli()))
	if len(keys) == 0 {
		return resetNames(l), nil
	}
	marks := "0"
	if l.capsTokens() {
		var key strings.Builder
		writeResetKey(&key, l.Prefix)
		keys, marks = append(keys, key.String()), "1"
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	err := resetScript.Run(ctx, s.client, keys, s.clock.Script(now), marks).Err()
	watch.RedisCall("reset", time.Since(start), err)
	if err != nil {
		return nil, err
	}
	return resetNames(l), nil
}

// resetKeys are the keys a reset of l at the gateway's clock now deletes:
// those of each window l caps in four periods of its span, from the one
// before the previous to the next, and its bucket's. A Redis clock up to a
// period behind the gateway's reads the period before the previous as its
// previous one; one up to a period ahead writes the next. (The gateway names
// a call's keys by Redis's minute when its own is another: window.go.)
func resetKeys(l Limit, now moment) []string {
	var keys []string
	for k := range l.Each {
		b := now.In(k.Span()).Period
		for p := b - 2; p <= b+1; p++ {
			keys = append(keys, PeriodKey(l.Prefix, k, p))
		}
	}
	if l.Bucket.Rate > 0 {
		var key strings.Builder
		writeBucketKey(&key, l)
		keys = append(keys, key.String())
	}
	return keys
}

// admit answers from the refusal cache what Redis refused until Redis would
// admit it again, and asks Redis the rest.
func (s *RedisStore) Admit(ctx context.Context, chain []Limit, reserve TokenCounts) (Admission, error) {
	sent := s.clock.Gateway() // the cache bounds Redis's clock from a moment before the call
	resets := s.refusals.resetsSoFar()
	if a, ok := s.refusals.refusedLocally(chain, sent); ok {
		watch.RefusedFromCache()
		return a, nil
	}
	d, err := s.decide(ctx, chain, reserve)
	if err != nil {
		if ctx.Err() == nil {
			// Redis may come back without its counters, and then admit
			// what the cache remembers refused. A client that went away
			// is no store failure.
			s.refusals.forget()
		}
		return Admission{}, err
	}
	a, err := admissionOf(chain, d)
	if err == nil && !a.Admitted {
		s.refusals.record(chain, d, sent, resets)
	}
	return a, err
}

// refusedUnread is what the refusal cache refuses: only requests windows and
// buckets are cached, which no body changes.
func (s *RedisStore) RefusedUnread(chain []Limit) (Admission, bool) {
	a, ok := s.refusals.refusedLocally(chain, s.clock.Gateway())
	if ok {
		watch.RefusedFromCache()
	}
	return a, ok
}

// decide asks Redis for one admission, in a coalesced call where calls are.
func (s *RedisStore) decide(ctx context.Context, chain []Limit, reserve TokenCounts) (Decision, error) {
	if s.calls != nil {
		return s.admitCoalesced(ctx, chain, reserve)
	}
	return s.run(ctx, chain, reserve, false)
}

func (s *RedisStore) Peek(ctx context.Context, chain []Limit) (Decision, error) {
	return s.run(ctx, chain, TokenCounts{}, true)
}

// run decides one admission with admit.lua, which only reads when peek is
// set.
func (s *RedisStore) run(ctx context.Context, chain []Limit, reserve TokenCounts, peek bool) (Decision, error) {
	var c scriptCall
	c.add(chain, reserve)
	ds, _, err := s.call(ctx, &c, peek)
	if err != nil {
		return Decision{}, err
	}
	return ds[0], nil
}

// call runs admit.lua once for the admissions and token charges of c, and
// returns the admissions' decisions and the charges' outcome. A charge is
// never replayed (a double charge would outlive the failure): when a call
// that charges meets a dead connection, its charges fail with that error and
// its admissions are replayed alone.
func (s *RedisStore) call(ctx context.Context, c *scriptCall, peek bool) (ds []Decision, charged, err error) {
	op := "admit"
	switch {
	case peek:
		op = "peek"
	case len(c.chains) > 0:
	case c.charges.count() > 0:
		op = "record_tokens"
	default:
		op = "free_slots"
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if !peek && c.touchesSlots() {
		err := s.slotCalls.Acquire(ctx, 1)
		for _, chain := range c.frees.chains {
			s.held.take(chain, -1) // the requests have ended, whatever becomes of the call
		}
		if err != nil {
			watch.RedisCall(op, time.Since(start), err)
			return nil, err, err
		}
		defer s.slotCalls.Release(1)
	}
	// Charges and frees are never replayed: a second one would outlive the failure.
	once := c.charges.count() > 0 || len(c.frees.chains) > 0
	now := s.clock.Gateway()
	scriptClock, atMinute := s.clock.Script(now), MomentAt(now.UnixMilli()).Minute
	reply, err := s.runScript(ctx, admitScript, c.keys(atMinute), c.args(scriptClock, atMinute, peek, s.holder), !once)
	if b, ok := otherMinute(reply); ok && err == nil {
		// Redis's clock is in another minute than ours: nothing ran; name
		// the keys of its minute.
		atMinute = b
		reply, err = s.runScript(ctx, admitScript, c.keys(atMinute), c.args(scriptClock, atMinute, peek, s.holder), !once)
	}
	if once && len(c.chains) > 0 && s.config.topology() != cluster && isDeadConnection(err) {
		charged, c.charges, c.frees = err, chargeCall{}, slotFrees{}
		reply, err = s.replay(ctx, admitScript, c.keys(atMinute), c.args(scriptClock, atMinute, peek, s.holder))
	}
	watch.RedisCall(op, time.Since(start), err)
	if err != nil {
		return nil, err, err
	}
	if ds, err = c.decode(reply, !peek); err == nil && !peek {
		s.holdAdmitted(c, ds)
	}
	if charged == nil {
		charged = err
	}
	return ds, charged, err
}

// holdAdmitted counts in the ledger the slots of the call's admitted
// admissions, and holds the store open for their frees.
func (s *RedisStore) holdAdmitted(c *scriptCall, ds []Decision) {
	for m, d := range ds {
		if !d.Admitted {
			continue
		}
		holds := false
		for _, i := range []byte(c.chains[m]) {
			if l := c.limits[i-1]; l.Concurrent.Max > 0 {
				s.held.takeOne(l, 1)
				holds = true
			}
		}
		if holds {
			s.Hold()
		}
	}
}

// free rides in the next call (ride). It releases the store that the
// admission held for it.
func (s *RedisStore) Free(chain []Limit) {
	s.ride(&scriptItem{chain: chain, free: true, done: s.freed})
}

//go:embed renew.lua
var renewLua string

var renewScript = redis.NewScript(renewLua)

// renewalStep is the most limits one step of a renewal writes: a renewal
// of many limits goes in steps, so that neither Redis nor the calls that
// take or free slots wait on more than one step (each limit costs Redis
// about 4 µs: bench/README.md).
const renewalStep = 256

// renew writes the slots the store holds, each with a lease from Redis's
// clock, in steps of renewalStep limits.
func (s *RedisStore) renew() {
	for step := range slices.Chunk(s.held.limits(), renewalStep) {
		if !s.renewStep(step) {
			return // the next renewal comes within a third of a lease
		}
	}
}

// renewStep writes the slots held of limits: one call of renew.lua, or on
// Redis Cluster one per chain root, in one pipeline. It holds every unit
// of slotCalls, so that no call that takes or frees slots is in flight
// between the ledger's counts and their write.
func (s *RedisStore) renewStep(limits []Limit) bool {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	if err := s.slotCalls.Acquire(ctx, slotCallsMax); err != nil {
		watch.RedisCall("renew_slots", time.Since(start), err)
		return false
	}
	defer s.slotCalls.Release(slotCallsMax)
	byRoot := make(map[string][]slotRenewal)
	for _, l := range limits {
		root := ""
		if s.config.topology() == cluster {
			root = hashTag(l.Prefix)
		}
		byRoot[root] = append(byRoot[root], s.held.renewed(l))
	}
	clock := s.clock.Script(s.clock.Gateway())
	renewAll := func() error {
		pipe := s.client.Pipeline()
		for _, group := range byRoot {
			keys, args := renewalOf(group, clock, s.holder)
			renewScript.EvalSha(ctx, pipe, keys, args...)
		}
		_, err := pipe.Exec(ctx)
		return err
	}
	err := renewAll()
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		// Redis restarted, or failed over, since the script was loaded
		// (on Cluster, Load loads it on every shard).
		if err = renewScript.Load(ctx, s.client).Err(); err == nil {
			err = renewAll()
		}
	}
	watch.RedisCall("renew_slots", time.Since(start), err)
	return err == nil
}

// renewalOf is renew.lua's keys and arguments for the limits held.
func renewalOf(held []slotRenewal, clock, holder string) (keys []string, args []any) {
	keys, args = make([]string, len(held)), make([]any, 0, 2+2*len(held))
	args = append(args, clock, holder)
	for i, r := range held {
		keys[i] = SlotsKey(r.Limit)
		args = append(args, HexArg(r.n), HexArg(r.leaseMillis))
	}
	return keys, args
}

// gatewayMoment is the gateway's clock reading.
func (s *RedisStore) gatewayMoment() moment { return MomentAt(s.clock.Gateway().UnixMilli()) }

// otherMinute reads the scripts' answer {-1, now}: the keys named another
// minute than Redis's clock, and nothing ran.
func otherMinute(reply []int64) (int64, bool) {
	if len(reply) != 2 || reply[0] != -1 {
		return 0, false
	}
	return MomentAt(reply[1]).Minute, true
}

// runScript runs a script; only an admission may be replayed. An admission
// is executed at most twice in all
// (a send answered by NOSCRIPT, MOVED, ASK or TRYAGAIN did not run it):
//   - single node and Sentinel: go-redis does not retry (MaxRetries -1), and
//     an attempt that meets a dead connection is replayed once, by us, on a
//     fresh one: usually the first attempt never reached Redis. If it did and
//     only the reply was lost, the replay errs by one request towards
//     stricter, in a period that expires within two minutes.
//   - cluster: the client follows one MOVED or ASK, or resends once after a
//     dead connection, a timeout, TRYAGAIN or CLUSTERDOWN (MaxRedirects 1),
//     which stands in for our replay; we add none. A multi-key script in a
//     slot that is migrating gets TRYAGAIN (it did not run): that is retried
//     briefly, within the admission timeout, then handled like an outage.
func (s *RedisStore) runScript(ctx context.Context, script *redis.Script, keys []string, args []any, replay bool) ([]int64, error) {
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
	reply, err := evalSha(ctx, s.client, script, keys, args)
	if replay && isDeadConnection(err) {
		reply, err = s.replay(ctx, script, keys, args)
	}
	return reply, err
}

// evalSha runs script as go-redis's Script.Run does (EVALSHA, and its
// source once Redis answers NOSCRIPT, after a restart or a failover),
// with the keys passed by pointer and the reply read as integers: go-redis
// writes a *string as its string, and an interface holding a pointer costs
// no allocation where each key as a string costs one, as would each
// number of the reply read into an interface. Not on Cluster, whose client
// routes a call by its first key, read as a string.
func evalSha(ctx context.Context, c redis.UniversalClient, script *redis.Script, keys []string, args []any) ([]int64, error) {
	argv := make([]any, 0, 3+len(keys)+len(args))
	argv = append(argv, "evalsha", script.Hash(), len(keys))
	for i := range keys {
		argv = append(argv, &keys[i])
	}
	cmd := redis.NewIntSliceCmd(ctx, append(argv, args...)...)
	err := c.Process(ctx, cmd)
	if errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT") {
		return script.Eval(ctx, c, keys, args...).Int64Slice()
	}
	return cmd.Result()
}

// replay runs the admission once more on a connection dialled for it, since
// the pool's other idle connections may have died the same way.
func (s *RedisStore) replay(ctx context.Context, script *redis.Script, keys []string, args []any) ([]int64, error) {
	config := *s.config
	config.PoolSize = 1
	fresh, err := config.newClient(s.timeout)
	if err != nil {
		return nil, err
	}
	defer fresh.Close()
	return evalSha(ctx, fresh, script, keys, args)
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

// charge rides in the next call (ride).
func (s *RedisStore) Charge(chain []Limit, c Charge, done func(error)) {
	if !c.changes(chain, s.gatewayMoment()) {
		done(nil)
		return
	}
	s.ride(&scriptItem{chain: chain, charge: c, done: done})
}

// learnLua is learn.lua, which writes a provider's report.
//
//go:embed learn.lua
var learnLua string

var learnScript = redis.NewScript(learnLua)

// Learn writes the report on the learned key of each limit of chain that
// learns, in calls of learn.lua of their own, in a goroutine, coalesced
// per set of keys (reportQueue).
func (s *RedisStore) Learn(chain []Limit, r Report, done func(error)) {
	var keys cutText
	keys.grow(len(chain), 64)
	for _, l := range chain {
		if l.Learn {
			writeLearnedKey(&keys.text, l.Prefix)
			keys.end()
		}
	}
	if len(keys.ends) == 0 {
		done(nil)
		return
	}
	id := keys.text.String()
	q := &s.reports
	q.mu.Lock()
	if w, sending := q.waiting[id]; sending {
		w.add(r, done)
		q.mu.Unlock()
		return
	}
	q.waiting[id] = &waitingReport{}
	q.mu.Unlock()
	go s.sendReports(id, keys.strings(), r, []func(error){done})
}

// reportQueue coalesces the reports of each set of learned keys: one call
// of learn.lua in flight at a time, and the reports that come meanwhile
// merged into the next (merged), so that a provider answering thousands of
// requests a second costs Redis a call per round trip rather than one per
// answer.
type reportQueue struct {
	mu      sync.Mutex
	waiting map[string]*waitingReport // by the keys, joined; present while a call of them is in flight
}

// waitingReport is what waits for the call in flight of its keys.
type waitingReport struct {
	report Report
	dones  []func(error)
}

func (w *waitingReport) add(r Report, done func(error)) {
	if len(w.dones) == 0 {
		w.report = r
	} else {
		w.report = merged(w.report, r)
	}
	w.dones = append(w.dones, done)
}

// merged is the report that stands for a and b: the newer one's quotas (an
// older report would not overwrite them), and the later of their pauses.
func merged(a, b Report) Report {
	if b.At < a.At {
		a, b = b, a
	}
	if a.Refused && (!b.Refused || a.At+a.Wait > b.At+b.Wait) {
		b.Refused, b.Wait, b.WaitFrom = true, max(a.At+a.Wait-b.At, 0), a.WaitFrom
	}
	return b
}

// sendReports writes r on keys, then what waited meanwhile, until nothing
// waits.
func (s *RedisStore) sendReports(id string, keys []string, r Report, dones []func(error)) {
	for {
		err := s.sendReport(keys, r)
		for _, done := range dones {
			done(err)
		}
		q := &s.reports
		q.mu.Lock()
		w := q.waiting[id]
		if len(w.dones) == 0 {
			delete(q.waiting, id)
			q.mu.Unlock()
			return
		}
		r, dones = w.report, w.dones
		*w = waitingReport{}
		q.mu.Unlock()
	}
}

// sendReport is a call of learn.lua that learns r on keys.
func (s *RedisStore) sendReport(keys []string, r Report) error {
	args := make([]any, 0, 4+4*NumLearned)
	args = append(args, strconv.FormatInt(r.At, 10), flagArg(r.Refused), strconv.FormatInt(r.Wait, 10), strconv.FormatInt(r.WaitFrom, 10))
	for _, q := range r.Quotas {
		args = append(args, strconv.FormatInt(q.Limit, 10), strconv.FormatInt(q.Remaining, 10), strconv.FormatInt(q.ResetMillis, 10), strconv.FormatInt(q.From, 10))
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	err := learnScript.Run(ctx, s.client, keys, args...).Err()
	watch.RedisCall("learn", time.Since(start), err)
	return err
}

// ride puts an item nobody waits for (a token charge, a free) in the
// coalescer's next call; on Redis Cluster, where calls are not coalesced,
// in a call of its own, in a goroutine.
func (s *RedisStore) ride(item *scriptItem) {
	if s.calls != nil {
		s.calls.Ride(item)
		return
	}
	go func() {
		b := scriptBatch{store: s}
		b.Add(item)
		b.Send()
	}()
}

// Interface guards
var _ Store = (*RedisStore)(nil)

// admitCoalesced waits for the admission's decision, at most the store's
// timeout in all, whether others make the calls or its own is in flight
// (which may then still decide and charge it: doc.go). An admission that
// makes its call at once is bounded by the call's own timeout.
func (s *RedisStore) admitCoalesced(ctx context.Context, chain []Limit, reserve TokenCounts) (Decision, error) {
	item := &scriptItem{chain: chain, reserve: reserve, answer: make(chan scriptAnswer, 1)}
	a, err := coalesce.Await(ctx, s.calls, item, item.answer, s.timeout)
	if err != nil {
		// A call may still decide the admission, for no one: the waiter
		// that gives up claims it, and frees what the call that answered
		// first took (scriptBatch.Send frees what it answers after).
		if !item.claim.CompareAndSwap(unclaimed, abandoned) {
			if a := <-item.answer; a.err == nil && a.d.Admitted && HoldsSlots(chain) {
				s.Free(chain)
			}
		}
		return Decision{}, err
	}
	return a.d, a.err
}
