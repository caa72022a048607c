package limiter

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// newSlotLimit is a limit without a hash tag that caps requests in flight
// at slots, each lease long, and requests per minute at perMinute (0: no
// cap).
func newSlotLimit(scope, id string, slots, perMinute int64, lease time.Duration) Limit {
	caps := CapsOfWindows(WindowCaps{RPM: perMinute})
	caps.Concurrent = concurrencyCap{Max: slots, LeaseMillis: lease.Milliseconds()}
	return NewLimit("", scope, id, caps)
}

// inFlight is the slots of the chain's i-th limit held at the pinned time,
// by every holder, as an admission reads them.
func inFlight(t *testing.T, s Store, chain []Limit, i int, at int64) int64 {
	t.Helper()
	d, err := pinned(s, at).Peek(context.Background(), chain)
	if err != nil {
		t.Fatal(err)
	}
	return d.Counts[i].Slots
}

// heldCount is how many slots of the limit with prefix the ledger h holds.
func heldCount(h *heldSlots, prefix string) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	if e := h.byPrefix[prefix]; e != nil {
		return e.n
	}
	return 0
}

// renewSlots renews the slots s holds now, as its renewal does every third
// of a lease.
func renewSlots(s Store, at int64) {
	pinned(s, at).(interface{ renew() }).renew()
}

// freeAndWait frees an admission's slots on s and waits until the store has
// counted the free (a Redis store's free rides in a later call).
func freeAndWait(t *testing.T, s Store, chain []Limit) {
	t.Helper()
	s.Free(chain)
	if r, ok := s.(*RedisStore); ok {
		if err := rideAlong(r); err != nil {
			t.Fatal(err)
		}
	}
}

// rideAlong waits for a call that carries what rides in s's coalescer now
// (an empty charge rides after it, in the same call or a later one), and
// returns that call's outcome.
func rideAlong(s *RedisStore) error {
	done := make(chan error, 1)
	s.calls.Ride(&scriptItem{done: func(err error) { done <- err }})
	return <-done
}

func runSlotConformance(t *testing.T, kit storeKit) {
	const lease = 3 * time.Second
	t.Run("ASlotIsTakenInTheAdmissionAndFreedOnce", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase() + 1000
		chain := []Limit{newSlotLimit("key", redistest.UniqueID(t), 2, 0, lease)}
		fill(t, s, chain, at, 2)
		d := admitOrFail(t, s, chain, at)
		if d.Admitted {
			t.Fatal("a third request admitted under concurrent 2")
		}
		ref := RefusalOf(chain, d)
		if ref.Kind != Concurrency || !ref.UntilFreed || ref.Capacity != 2 {
			t.Fatalf("refusal %+v, want kind concurrency with no known wait", ref)
		}
		freeAndWait(t, pinned(s, at), chain)
		if n := inFlight(t, s, chain, 0, at); n != 1 {
			t.Fatalf("%d in flight after one of two was freed, want 1", n)
		}
		fill(t, s, chain, at, 1)
		freeAndWait(t, pinned(s, at), chain)
		freeAndWait(t, pinned(s, at), chain)
		if n := inFlight(t, s, chain, 0, at); n != 0 {
			t.Fatalf("%d in flight once every request ended, want 0", n)
		}
	})
	t.Run("ThreeReplicasRacing60AgainstConcurrent5AdmitExactlyFiveAndFreeThemAll", func(t *testing.T) {
		stores := kit.replicas(t, 3)
		at := pinnedBase() + 1000
		chain := []Limit{newSlotLimit("key", redistest.UniqueID(t), 5, 0, lease)}
		var mu sync.Mutex
		var holders []Store
		var wg sync.WaitGroup
		for i := range 60 {
			s := stores[i%3]
			wg.Go(func() {
				a, err := pinned(s, at).Admit(context.Background(), chain, TokenCounts{})
				if err != nil {
					t.Error(err)
					return
				}
				if a.Admitted {
					mu.Lock()
					holders = append(holders, s)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if len(holders) != 5 {
			t.Fatalf("admitted %d of 60 racing requests under concurrent 5, want exactly 5", len(holders))
		}
		if n := inFlight(t, stores[0], chain, 0, at); n != 5 {
			t.Fatalf("%d in flight, want 5", n)
		}
		for _, s := range holders {
			freeAndWait(t, s, chain)
		}
		if n := inFlight(t, stores[1], chain, 0, at); n != 0 {
			t.Fatalf("%d in flight once all ended, want 0", n)
		}
	})
	t.Run("ARequestRefusedByRPMTakesNoSlotAndOneRefusedBySlotsNoRPM", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase() + 1000
		byRPM := []Limit{newSlotLimit("key", redistest.UniqueID(t), 5, 1, lease)}
		fill(t, s, byRPM, at, 1)
		if admitOrFail(t, s, byRPM, at).Admitted {
			t.Fatal("admitted over rpm 1")
		}
		if n := inFlight(t, s, byRPM, 0, at); n != 1 {
			t.Fatalf("%d slots held after a refusal by rpm, want the admitted one's 1", n)
		}
		bySlots := []Limit{newSlotLimit("key", redistest.UniqueID(t), 1, 10, lease)}
		fill(t, s, bySlots, at, 1)
		if admitOrFail(t, s, bySlots, at).Admitted {
			t.Fatal("admitted over concurrent 1")
		}
		if n := kit.count(t, s, bySlots[0].Prefix, RPM, at/MinuteMillis); n != 1 {
			t.Fatalf("rpm counted %d after a refusal by the slots, want the admitted one's 1", n)
		}
		freeAndWait(t, pinned(s, at), byRPM)
		freeAndWait(t, pinned(s, at), bySlots)
	})
	t.Run("ARefusalByOneLimitOfTheChainTakesNoSlotOfAnother", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase() + 1000
		team := newSlotLimit("team", redistest.UniqueID(t), 10, 0, lease)
		key := newSlotLimit("key", redistest.UniqueID(t), 1, 0, lease)
		chain := []Limit{key, team}
		fill(t, s, chain, at, 1)
		if admitOrFail(t, s, chain, at).Admitted {
			t.Fatal("admitted over the key's concurrent 1")
		}
		if n := inFlight(t, s, chain, 1, at); n != 1 {
			t.Fatalf("the team holds %d slots after its key refused, want 1", n)
		}
		freeAndWait(t, pinned(s, at), chain)
	})
	t.Run("ARenewedSlotOutlivesItsLeaseAndAnUnrenewedOneLapses", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase() + 1000
		chain := []Limit{newSlotLimit("key", redistest.UniqueID(t), 2, 0, lease)}
		fill(t, s, chain, at, 2)
		renewSlots(s, at+2000)
		if n := inFlight(t, s, chain, 0, at+lease.Milliseconds()+1000); n != 2 {
			t.Fatalf("%d slots held a lease after their admission and 1 s after their renewal, want 2", n)
		}
		lapsed := at + 2000 + lease.Milliseconds()
		if n := inFlight(t, s, chain, 0, lapsed-1); n != 2 {
			t.Fatalf("%d slots held 1 ms before the renewed lease ends, want 2", n)
		}
		if n := inFlight(t, s, chain, 0, lapsed); n != 0 {
			t.Fatalf("%d slots held once the lease lapsed unrenewed, want 0", n)
		}
		// The requests still run: the next renewal holds their slots again.
		fill(t, s, chain, lapsed, 1)
		renewSlots(s, lapsed+1)
		if n := inFlight(t, s, chain, 0, lapsed+1); n != 3 {
			t.Fatalf("%d slots held after the renewal of 3 live requests, want 3", n)
		}
		for range 3 {
			freeAndWait(t, pinned(s, lapsed+1), chain)
		}
		if n := inFlight(t, s, chain, 0, lapsed+1); n != 0 {
			t.Fatalf("%d slots held once all 3 ended, want 0", n)
		}
	})
	t.Run("ASlotsLeaseIsTheLongestItsHoldersAskedFor", func(t *testing.T) {
		// Two handlers, or a config and its reload, may give one limit two
		// slot_lease values: its slots are then held as long as the longer.
		s := kit.replicas(t, 1)[0]
		id := redistest.UniqueID(t)
		short := []Limit{newSlotLimit("key", id, 2, 0, lease)}
		long := []Limit{newSlotLimit("key", id, 2, 0, 10*lease)}
		for _, order := range [][2][]Limit{{long, short}, {short, long}} {
			at := pinnedBase() + 1000
			fill(t, s, order[0], at, 1)
			fill(t, s, order[1], at+1, 1)
			if n := inFlight(t, s, short, 0, at+1+lease.Milliseconds()); n != 2 {
				t.Fatalf("taken under the %v lease, then the %v: %d in flight once the shorter lease passed, want 2",
					time.Duration(order[0][0].Concurrent.LeaseMillis)*time.Millisecond, time.Duration(order[1][0].Concurrent.LeaseMillis)*time.Millisecond, n)
			}
			if admitOrFail(t, s, short, at+1+lease.Milliseconds()).Admitted {
				t.Fatal("a third admitted under concurrent 2 once the shorter lease passed")
			}
			renewed := at + 2000
			renewSlots(s, renewed)
			if n := inFlight(t, s, short, 0, renewed+lease.Milliseconds()); n != 2 {
				t.Fatalf("%d in flight a shorter lease after a renewal, want 2: the renewal renews with the longest lease of the slots' holders", n)
			}
			// Once the request of the longer lease has ended, the renewal
			// renews the other with its own.
			freeAndWait(t, pinned(s, renewed), long)
			renewSlots(s, renewed)
			if n := inFlight(t, s, short, 0, renewed+lease.Milliseconds()-1); n != 1 {
				t.Fatalf("%d in flight 1 ms before the shorter lease of the one left ends, want 1", n)
			}
			if n := inFlight(t, s, short, 0, renewed+lease.Milliseconds()); n != 0 {
				t.Fatalf("%d in flight once the shorter lease of the one left lapsed unrenewed, want 0", n)
			}
			freeAndWait(t, pinned(s, renewed), short)
			renewSlots(s, renewed)
		}
	})
	t.Run("AFreeOfALapsedLeaseFreesNothingTwice", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase() + 1000
		chain := []Limit{newSlotLimit("key", redistest.UniqueID(t), 2, 0, lease)}
		fill(t, s, chain, at, 1)
		lapsed := at + lease.Milliseconds()
		fill(t, s, chain, lapsed, 1) // the first one's lease lapsed: this one holds the only slot
		freeAndWait(t, pinned(s, lapsed), chain)
		if n := inFlight(t, s, chain, 0, lapsed); n != 0 {
			t.Fatalf("%d in flight, want 0", n)
		}
		freeAndWait(t, pinned(s, lapsed), chain)
		if n := inFlight(t, s, chain, 0, lapsed); n != 0 {
			t.Fatalf("%d in flight after a free with nothing held, want 0: never negative", n)
		}
		fill(t, s, chain, lapsed, 2)
		if admitOrFail(t, s, chain, lapsed).Admitted {
			t.Fatal("a third admitted under concurrent 2: a free made room it had not taken")
		}
		freeAndWait(t, pinned(s, lapsed), chain)
		freeAndWait(t, pinned(s, lapsed), chain)
	})
}

// A holder that stops renewing (a gateway killed, or cut off) loses its
// slots once its lease has passed: another holder admits again.
func TestAHolderThatStopsRenewingLosesItsSlotsWithinOneLease(t *testing.T) {
	url := redistest.EnvURL(t)
	dead, live := newTestRedisStore(t, url), newTestRedisStore(t, url)
	at := pinnedBase() + 1000
	lease := 2 * time.Second
	chain := []Limit{newSlotLimit("key", redistest.UniqueID(t), 2, 0, lease)}
	fill(t, dead, chain, at, 2)
	if admitOrFail(t, live, chain, at+lease.Milliseconds()-1).Admitted {
		t.Fatal("another holder admitted before the dead one's lease ended")
	}
	fill(t, live, chain, at+lease.Milliseconds(), 2)
	if n := inFlight(t, live, chain, 0, at+lease.Milliseconds()); n != 2 {
		t.Fatalf("%d in flight, want the live holder's 2", n)
	}
	freeAndWait(t, pinned(live, at+lease.Milliseconds()), chain)
	freeAndWait(t, pinned(live, at+lease.Milliseconds()), chain)
}

// A free that never reached Redis (its connection died under it) is not
// retried: the slot stays held in Redis until the holder's next renewal
// writes what it holds, which frees it.
func TestAFreeThatNeverReachedRedisIsMendedByTheNextRenewal(t *testing.T) {
	url := redistest.EnvURL(t)
	opts, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	proxy := redistest.NewResetProxy(t, opts.Addr)
	holder := newTestRedisStoreOf(t, &RedisDeployment{URL: "redis://" + proxy.Addr() + "/0"}, time.Second)
	other := newTestRedisStore(t, url)
	at := pinnedBase() + 1000
	chain := []Limit{newSlotLimit("key", redistest.UniqueID(t), 1, 0, 30*time.Second)}
	fill(t, holder, chain, at, 1)

	proxy.ResetAtNextCommand()
	pinned(holder, at).Free(chain)
	if err := rideAlong(holder); err == nil {
		t.Fatal("the free's call succeeded through a connection reset at its command")
	}
	if admitOrFail(t, other, chain, at).Admitted {
		t.Fatal("admitted while the lost free left the slot held in Redis: the test did not lose the free")
	}
	renewSlots(holder, at)
	if n := inFlight(t, other, chain, 0, at); n != 0 {
		t.Fatalf("%d in flight after the renewal of a holder that holds none, want 0", n)
	}
	fill(t, other, chain, at, 1)
	freeAndWait(t, pinned(other, at), chain)
}

// A Redis that lost a holder's slots (a restart that emptied it) counts
// them again at the holder's next renewal, once: its requests still run.
func TestSlotsRedisLostAreHeldAgainAfterTheNextRenewal(t *testing.T) {
	url := redistest.EnvURL(t)
	holder, other := newTestRedisStore(t, url), newTestRedisStore(t, url)
	at := pinnedBase() + 1000
	chain := []Limit{newSlotLimit("key", redistest.UniqueID(t), 3, 0, 30*time.Second)}
	fill(t, holder, chain, at, 2)
	if err := redistest.TestClient(t, url).Del(context.Background(), SlotsKey(chain[0])).Err(); err != nil {
		t.Fatal(err)
	}
	fill(t, other, chain, at, 1)
	renewSlots(holder, at)
	renewSlots(holder, at) // a second renewal counts nothing twice
	if n := inFlight(t, other, chain, 0, at); n != 3 {
		t.Fatalf("%d in flight after the renewal, want the holder's 2 and the other's 1", n)
	}
	if admitOrFail(t, other, chain, at).Admitted {
		t.Fatal("admitted a fourth under concurrent 3")
	}
	freeAndWait(t, pinned(other, at), chain)
	freeAndWait(t, pinned(holder, at), chain)
	freeAndWait(t, pinned(holder, at), chain)
	if n := inFlight(t, other, chain, 0, at); n != 0 {
		t.Fatalf("%d in flight once all ended, want 0", n)
	}
}

// An admission whose waiter gave up (its timeout passed while its call was
// in flight) fails open and holds nothing: when the call admits it after
// all, the call frees its slots.
func TestAnAdmissionNobodyWaitsForAnyMoreHoldsNoSlot(t *testing.T) {
	url := redistest.EnvURL(t)
	s := newTestRedisStore(t, url)
	at := pinnedBase() + 1000
	chain := []Limit{newSlotLimit("key", redistest.UniqueID(t), 1, 0, 30*time.Second)}
	item := &scriptItem{chain: chain, answer: make(chan scriptAnswer, 1)}
	item.claim.Store(abandoned)
	b := &scriptBatch{store: pinned(s, at)}
	b.Add(item)
	b.Send()
	if a := <-item.answer; a.err != nil || !a.d.Admitted {
		t.Fatalf("the call answered %+v, want an admission", a)
	}
	if err := rideAlong(s); err != nil { // the free the call sent rides before it
		t.Fatal(err)
	}
	if n := inFlight(t, s, chain, 0, at); n != 0 {
		t.Fatalf("%d in flight after an abandoned admission, want 0", n)
	}
	if n := heldCount(s.held, chain[0].Prefix); n != 0 {
		t.Fatalf("the ledger holds %d slots of an abandoned admission, want 0", n)
	}
}

// BenchmarkSlotRenewal is what one renewal costs a store that holds the
// slots of 10,000 requests in flight, on 1,000 keys of one team and org
// (1,002 limits held) or on 10,000 keys (10,002): the gateway's time, and
// Redis's server time, per renewal. A store renews every third of
// slot_lease, 10 s by default, whatever the number of requests.
func BenchmarkSlotRenewal(b *testing.B) {
	const inFlight = 10_000
	for _, keys := range []int{1000, 10_000} {
		chainOf := func(i int) []Limit { return withSlots(benchChain(3, fmt.Sprintf("renew%d-%d", keys, i%keys))) }
		b.Run(fmt.Sprintf("memory/keys=%d", keys), func(b *testing.B) {
			s := newTestMemoryStore(b, time.Hour)
			holdSlots(b, s, inFlight, chainOf)
			for b.Loop() {
				s.renew()
			}
		})
		if url := os.Getenv(redistest.URLEnv); url != "" {
			b.Run(fmt.Sprintf("redis/keys=%d", keys), func(b *testing.B) {
				s := newTestRedisStore(b, url)
				holdSlots(b, s, inFlight, chainOf)
				admin := redistest.TestClient(b, url)
				if err := admin.ConfigResetStat(context.Background()).Err(); err != nil {
					b.Fatal(err)
				}
				for b.Loop() {
					s.renew()
				}
				_, usec := redistest.CommandStats(b, admin, "evalsha")
				b.ReportMetric(usec/float64(b.N), "redis-µs/renewal")
			})
		}
	}
}

// holdSlots admits n requests of chainOf(0), chainOf(1), … on s, 32 at
// once, and frees them when the benchmark ends.
func holdSlots(b *testing.B, s Store, n int, chainOf func(int) []Limit) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				if a, err := s.Admit(context.Background(), chainOf(i), TokenCounts{}); err != nil || !a.Admitted {
					b.Errorf("admission %d: %v, admitted %v", i, err, a.Admitted)
					return
				}
			}
		})
	}
	wg.Wait()
	b.Cleanup(func() {
		for i := range n {
			s.Free(chainOf(i))
		}
		if r, ok := s.(*RedisStore); ok {
			_ = rideAlong(r)
		}
	})
}

// A limit whose lease is shorter than those the ledger already holds is
// renewed before its own lease ends, not a third of theirs later: a
// process may hold slots of handlers with different slot_lease values, or
// of the config before a reload that shortened it.
func TestASlotOfAShorterLeaseThanThoseHeldIsRenewedBeforeItsLeaseEnds(t *testing.T) {
	h := newHeldSlots()
	h.take([]Limit{newSlotLimit("key", "long", 1, 0, 30*time.Second)}, 1)
	checkRenewedWithinItsLease(t, h, newSlotLimit("key", "short", 1, 0, 600*time.Millisecond), "another limit")
}

// A limit already in the ledger, taken under a shorter lease than the one
// the renewal waits out (another handler's slot_lease, or a reload's), is
// renewed before its own lease ends: a slot of it may be the only one held.
func TestALimitHeldTakenUnderAShorterLeaseIsRenewedBeforeItsLeaseEnds(t *testing.T) {
	h := newHeldSlots()
	id := redistest.UniqueID(t)
	h.take([]Limit{newSlotLimit("key", id, 1, 0, 30*time.Second)}, 1)
	// Its request ended; the renewal has yet to drop it.
	h.take([]Limit{newSlotLimit("key", id, 1, 0, 30*time.Second)}, -1)
	checkRenewedWithinItsLease(t, h, newSlotLimit("key", id, 1, 0, 600*time.Millisecond), "the same limit")
}

// checkRenewedWithinItsLease starts the renewal of what h holds (a slot of
// a 30 s lease), and once it waits out that lease's period, takes a slot
// of short, of what (the same limit or another): the renewal must come
// within short's lease.
func checkRenewedWithinItsLease(t *testing.T, h *heldSlots, short Limit, what string) {
	t.Helper()
	<-h.taken // the renewal starts with a limit held
	renewed := make(chan time.Time, 16)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		h.renewEvery(func() { renewed <- time.Now() }, stop)
	}()
	defer func() {
		close(stop)
		<-done
	}()
	waitBlockedInSelect(t, "(*heldSlots).renewEvery") // waiting to renew the long lease
	lease := time.Duration(short.Concurrent.LeaseMillis) * time.Millisecond
	taken := time.Now()
	h.take([]Limit{short}, 1)
	select {
	case at := <-renewed:
		if took := at.Sub(taken); took > lease {
			t.Fatalf("renewed %v after a slot of lease %v was taken", took, lease)
		}
	case <-time.After(lease):
		t.Fatalf("not renewed within the lease (%v) of a slot of %s taken while the ledger held one of 30s", lease, what)
	}
}

// waitBlockedInSelect waits until a goroutine is blocked in a select of
// the function named fn.
func waitBlockedInSelect(t *testing.T, fn string) {
	t.Helper()
	buf := make([]byte, 1<<20)
	for deadline := time.Now().Add(5 * time.Second); ; runtime.Gosched() {
		n := runtime.Stack(buf, true)
		for g := range strings.SplitSeq(string(buf[:n]), "\n\n") {
			if state, _, _ := strings.Cut(g, "\n"); strings.Contains(state, "[select") && strings.Contains(g, fn+"(") {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no goroutine blocked in a select of %s", fn)
		}
	}
}

// A Redis restarted empty has lost the renewal's script as well as the
// slots: the renewal loads the script again and writes the slots held.
func TestARenewalAfterARedisRestartLoadsItsScriptAndHoldsTheSlotsAgain(t *testing.T) {
	srv := redistest.NewServer(t)
	s := newTestRedisStoreOf(t, &RedisDeployment{URL: srv.URL()}, time.Second)
	chain := []Limit{newSlotLimit("key", redistest.UniqueID(t), 2, 0, 30*time.Second)}
	fill(t, s, chain, 0, 2)
	renewSlots(s, 0) // the script is loaded
	srv.Stop()
	srv.Restart(t)
	// The pool's connections died with the server: the first renewal may
	// meet one of them, and the next one, a third of a lease later, goes on.
	for range 2 {
		renewSlots(s, 0)
	}
	if n := inFlight(t, s, chain, 0, 0); n != 2 {
		t.Fatalf("%d in flight after the restart and a renewal, want the 2 still running", n)
	}
	freeAndWait(t, s, chain)
	freeAndWait(t, s, chain)
}

// A slots key outlives the holding of every holder: a holder of a shorter
// lease (another process, whose handler or config has a shorter
// slot_lease) never shortens the key's life under another's longer one.
func TestASlotsKeyOutlivesTheLongestLeaseOfItsHolders(t *testing.T) {
	url := redistest.EnvURL(t)
	longHolder, shortHolder := newTestRedisStore(t, url), newTestRedisStore(t, url)
	const long, short = 30 * time.Second, time.Second
	id := redistest.UniqueID(t)
	longChain, shortChain := []Limit{newSlotLimit("key", id, 3, 0, long)}, []Limit{newSlotLimit("key", id, 3, 0, short)}
	at := pinnedBase() + 1000
	fill(t, longHolder, longChain, at, 1)
	fill(t, shortHolder, shortChain, at, 1)
	renewSlots(shortHolder, at)
	c := redistest.TestClient(t, url)
	ttl, err := c.PTTL(context.Background(), SlotsKey(longChain[0])).Result()
	if err != nil {
		t.Fatal(err)
	}
	if ttl < long {
		t.Fatalf("the slots key expires in %v, before the lease of %v that a holder's slots hold", ttl, long)
	}
	freeAndWait(t, pinned(longHolder, at), longChain)
	freeAndWait(t, pinned(shortHolder, at), shortChain)
}
