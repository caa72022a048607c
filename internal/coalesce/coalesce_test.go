package coalesce

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"
)

// recordingBatch is a call of ints whose send waits for release, and records
// what each call held.
type recordingBatch struct {
	r     *callRecorder
	items []int
}

type callRecorder struct {
	mu      sync.Mutex
	calls   [][]int
	release chan struct{} // nil: send returns at once; else a call whose first item is 0 waits until it is closed
	full    int           // add refuses an item once a call holds this many; 0: never
	answers map[int]chan int

	releaseOthers chan struct{} // release for the calls whose first item is another
}

// answerFor is where the calls answer item.
func (r *callRecorder) answerFor(item int) chan int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.answers == nil {
		r.answers = make(map[int]chan int)
	}
	r.answers[item] = make(chan int, 1)
	return r.answers[item]
}

func (r *callRecorder) start(first int) Batch[int] { return &recordingBatch{r: r, items: []int{first}} }

func (b *recordingBatch) Add(item int) bool {
	if b.r.full > 0 && len(b.items) == b.r.full {
		return false
	}
	b.items = append(b.items, item)
	return true
}

func (b *recordingBatch) Send() {
	b.r.mu.Lock()
	b.r.calls = append(b.r.calls, b.items)
	release := b.r.release
	if b.items[0] != 0 {
		release = b.r.releaseOthers
	}
	b.r.mu.Unlock()
	if release != nil {
		<-release // the call stays in flight until the test releases it
	}
	b.r.mu.Lock()
	for _, item := range b.items {
		b.r.answers[item] <- item
	}
	b.r.mu.Unlock()
}

func (r *callRecorder) recorded() [][]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

// submit awaits item in a goroutine, and returns once the item's call is
// made or the item waits behind n others; done is called when it returns.
func submit(q *Coalescer[int], r *callRecorder, item int, ctx context.Context, n int, done func(answered bool)) {
	calls := len(r.recorded())
	answer := r.answerFor(item)
	go func() {
		got, err := Await(ctx, q, item, answer, time.Hour)
		done(err == nil && got == item)
	}()
	for len(r.recorded()) == calls {
		q.mu.Lock()
		w := len(q.waiting)
		q.mu.Unlock()
		if w == n+1 {
			return
		}
		runtime.Gosched()
	}
}

// submitAll submits items one after another, each once the one before it
// waits, behind n others, so that their arrival order is known.
func submitAll(t *testing.T, q *Coalescer[int], r *callRecorder, items []int, n int) *sync.WaitGroup {
	var wg sync.WaitGroup
	for i, item := range items {
		wg.Add(1)
		submit(q, r, item, context.Background(), n+i, func(answered bool) {
			if !answered {
				t.Errorf("item %d was not answered by its call", item)
			}
			wg.Done()
		})
	}
	return &wg
}

// waitIdle returns once no call is in flight and nothing waits: the last
// caller hands nothing on.
func waitIdle(q *Coalescer[int]) {
	for {
		q.mu.Lock()
		idle := q.calls == 0 && len(q.waiting) == 0 && len(q.riders) == 0
		q.mu.Unlock()
		if idle {
			return
		}
		runtime.Gosched()
	}
}

// A lone request makes its call in its own goroutine, at once.
func TestLoneSubmissionMakesItsCallItself(t *testing.T) {
	r := &callRecorder{}
	q := New(1, time.Hour, r.start)
	if got, err := Await(context.Background(), q, 7, r.answerFor(7), time.Hour); err != nil || got != 7 {
		t.Fatalf("await = %d, %v", got, err)
	}
	if calls := r.recorded(); !slices.EqualFunc(calls, [][]int{{7}}, slices.Equal) {
		t.Fatalf("calls %v, want one call of the lone item, made before await returned", calls)
	}
}

// Items that arrive while every call is in flight go in the next call, in
// arrival order, up to what a call can hold; the rest go in the call after.
func TestItemsWaitingOnABusyCallGoInTheNextCallsInArrivalOrder(t *testing.T) {
	r := &callRecorder{release: make(chan struct{}), full: 3}
	q := New(1, time.Hour, r.start)
	first := submitAll(t, q, r, []int{0}, 0) // in flight until released
	rest := submitAll(t, q, r, []int{1, 2, 3, 4, 5}, 0)
	close(r.release)
	first.Wait()
	rest.Wait()
	want := [][]int{{0}, {1, 2, 3}, {4, 5}}
	if calls := r.recorded(); !slices.EqualFunc(calls, want, slices.Equal) {
		t.Fatalf("calls %v, want %v", calls, want)
	}
	waitIdle(q)
}

// A waiter whose context ends before a call takes it is in no call, and the
// items around it are still sent: the first waiting leads the next call and
// takes the others.
func TestAnItemThatGaveUpWaitingIsInNoCallAndTheRestAreSent(t *testing.T) {
	r := &callRecorder{release: make(chan struct{})}
	q := New(1, time.Hour, r.start)
	first := submitAll(t, q, r, []int{0}, 0)
	before := submitAll(t, q, r, []int{1}, 0)
	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := make(chan bool, 1)
	submit(q, r, 2, ctx, 1, func(answered bool) { gaveUp <- !answered })
	after := submitAll(t, q, r, []int{3}, 2)
	cancel()
	if !<-gaveUp {
		t.Fatal("await answered an item whose context ended while it waited")
	}
	close(r.release)
	first.Wait()
	before.Wait()
	after.Wait()
	want := [][]int{{0}, {1, 3}}
	if calls := r.recorded(); !slices.EqualFunc(calls, want, slices.Equal) {
		t.Fatalf("calls %v, want %v", calls, want)
	}
	waitIdle(q)
}

// A token charge takes no call of its own while calls come: it rides in the
// next one, made by an admission; with no other traffic a call is made for it
// once the linger is over.
func TestARiderGoesInTheNextCallAndAloneOnlyAfterTheLinger(t *testing.T) {
	r := &callRecorder{}
	q := New(1, time.Hour, r.start)
	rider := r.answerFor(100)
	q.Ride(100)
	if calls := r.recorded(); len(calls) != 0 {
		t.Fatalf("calls %v before any admission: a rider made its own", calls)
	}
	if _, err := Await(context.Background(), q, 1, r.answerFor(1), time.Hour); err != nil {
		t.Fatal("admission not answered")
	}
	if got := <-rider; got != 100 {
		t.Fatalf("rider answered %d", got)
	}
	if calls := r.recorded(); !slices.EqualFunc(calls, [][]int{{1, 100}}, slices.Equal) {
		t.Fatalf("calls %v, want the admission's call carrying the rider", calls)
	}

	alone := &callRecorder{}
	q = New(1, time.Millisecond, alone.start)
	rider = alone.answerFor(200)
	q.Ride(200)
	if got := <-rider; got != 200 {
		t.Fatalf("rider answered %d", got)
	}
	if calls := alone.recorded(); !slices.EqualFunc(calls, [][]int{{200}}, slices.Equal) {
		t.Fatalf("calls %v, want a call of the rider's own", calls)
	}
	waitIdle(q)
}

// A rider behind a call in flight, with nothing else coming, is sent after
// that call: by the flush, which the call's end arms.
func TestARiderBehindABusyCallIsSentAfterIt(t *testing.T) {
	r := &callRecorder{release: make(chan struct{})}
	q := New(1, time.Millisecond, r.start)
	first := submitAll(t, q, r, []int{0}, 0) // in flight until released
	rider := r.answerFor(300)
	q.Ride(300)
	close(r.release)
	first.Wait()
	if got := <-rider; got != 300 {
		t.Fatalf("rider answered %d", got)
	}
	if calls := r.recorded(); !slices.EqualFunc(calls, [][]int{{0}, {300}}, slices.Equal) {
		t.Fatalf("calls %v, want the busy call, then the rider's", calls)
	}
	waitIdle(q)
}

// The flush is set only while riders wait and a call could be made for them:
// a call that takes every rider disarms it, and while every call is in flight
// the end of one arms it, so that under load no timer fires for nothing.
func TestTheFlushIsSetOnlyWhileRidersWaitAndACallCouldBeMade(t *testing.T) {
	armed := func(q *Coalescer[int]) bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		return q.armed
	}
	r := &callRecorder{release: make(chan struct{})}
	q := New(1, time.Hour, r.start)
	r.answerFor(100)
	q.Ride(100)
	if !armed(q) {
		t.Fatal("a rider with no call in flight left the flush unset")
	}
	first := submitAll(t, q, r, []int{0}, 0) // takes the rider, in flight until released
	if armed(q) {
		t.Fatal("the flush is still set after a call took every rider")
	}
	r.answerFor(200)
	q.Ride(200)
	if armed(q) {
		t.Fatal("a rider behind the call in flight set the flush")
	}
	close(r.release)
	first.Wait()
	waitCallsEnded(q)
	if !armed(q) {
		t.Fatal("the call's end left its rider without a flush")
	}
}

// waitCallsEnded returns once no call is in flight.
func waitCallsEnded(q *Coalescer[int]) {
	for {
		q.mu.Lock()
		calls := q.calls
		q.mu.Unlock()
		if calls == 0 {
			return
		}
		runtime.Gosched()
	}
}

// A waiter whose call does not come within its timeout gives up with
// context.DeadlineExceeded, and is in no call.
func TestAWaiterGivesUpAfterItsTimeout(t *testing.T) {
	r := &callRecorder{release: make(chan struct{})}
	q := New(1, time.Hour, r.start)
	first := submitAll(t, q, r, []int{0}, 0)
	if _, err := Await(context.Background(), q, 1, r.answerFor(1), time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("await behind a busy call: %v, want context.DeadlineExceeded", err)
	}
	close(r.release)
	first.Wait()
	waitIdle(q)
	if calls := r.recorded(); !slices.EqualFunc(calls, [][]int{{0}}, slices.Equal) {
		t.Fatalf("calls %v, want only the first", calls)
	}
}

// A waiter gives up when its context ends even once its item is in a call in
// flight, whether it is the call's first item or not; the call still decides
// the item.
func TestAWaiterGivesUpWhenItsContextEndsWhileItsCallIsInFlight(t *testing.T) {
	r := &callRecorder{release: make(chan struct{}), releaseOthers: make(chan struct{})}
	q := New(1, time.Hour, r.start)
	first := submitAll(t, q, r, []int{0}, 0) // in flight until released
	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := make(chan bool, 2)
	for i, item := range []int{1, 2} {
		submit(q, r, item, ctx, i, func(answered bool) { gaveUp <- !answered })
	}
	close(r.release) // the next call, of 1 and 2, stays in flight
	first.Wait()
	for len(r.recorded()) < 2 {
		runtime.Gosched()
	}
	cancel()
	for range 2 {
		select {
		case gave := <-gaveUp:
			if !gave {
				t.Fatal("a waiter was answered by a call still in flight")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a waiter still waits on its call in flight after its context ended")
		}
	}
	close(r.releaseOthers)
	waitIdle(q)
	if calls := r.recorded(); !slices.EqualFunc(calls, [][]int{{0}, {1, 2}}, slices.Equal) {
		t.Fatalf("calls %v, want the first, then one of both waiters' items", calls)
	}
	for _, item := range []int{1, 2} {
		r.mu.Lock()
		answer := r.answers[item]
		r.mu.Unlock()
		if got := <-answer; got != item {
			t.Fatalf("the call answered item %d with %d", item, got)
		}
	}
}
