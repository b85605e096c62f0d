// Package tenancy owns what every edge of a node knows of an app: its
// registry entry resolved against the node's defaults (View), one reading
// of the registry resolved once for every edge (Snapshot), and the one
// rate limiter its buckets are spent from (Bucket). The WebSocket and SSE
// edges (loop) and the server API (fanout/api) are handed the same
// Snapshot, so they hold the very same Views, and spend the same kind of
// Bucket: a limit or a secret means one thing wherever a client comes in.
package tenancy

import (
	"crypto/subtle"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/roost-chat/roost/proto"
)

// Limits are the node-wide defaults of the per-app limits; an app's entry
// in the registry overrides any of them. 0 turns a limit off.
type Limits struct {
	MaxConns     int64   // connections of one app on the whole cluster
	MaxUserConns int64   // connections of one user of an app on this node
	PubRate      float64 // publishes per second of one user (on this node)
	PubBurst     int64   // publishes one user may send at once
	AppPubRate   float64 // publishes per second of one app on this node; its burst is one second's worth
	MaxMsg       int64   // bytes of one pub body (too_large above)
	MaxPresence  int64   // presence subscribers of one room of an app, per node (0: no limit)
	// Chat state, per connection: signals (typing, cursors), and read,
	// unread and receipts requests in a bucket of their own.
	SignalRate  float64
	SignalBurst int64
	ReadRate    float64
	ReadBurst   int64
	// MaxTokenTTL refuses tokens whose exp lies further ahead (0: no
	// bound): a leaked token is good for at most this long.
	MaxTokenTTL time.Duration
}

// DefaultLimits are limits no ordinary chat client reaches, and that every
// load test of docs/benchmarks.md stays under (in insecure mode the
// publish rates are off unless set: main clears them).
func DefaultLimits() Limits {
	return Limits{
		MaxConns:     1_000_000,
		MaxUserConns: 100,
		PubRate:      200,
		PubBurst:     400,
		AppPubRate:   50_000,
		MaxMsg:       64 << 10,
		MaxPresence:  10_000,
		SignalRate:   10,
		SignalBurst:  20,
		ReadRate:     10,
		ReadBurst:    20,
		MaxTokenTTL:  proto.DefaultMaxTokenTTL,
	}
}

// View is an app's registry entry resolved against the node's defaults.
// Immutable once built: a registry change builds a new one.
type View struct {
	ID        string
	Secrets   [][]byte // current first; the previous one while PrevUntil is ahead; empty for a first-use app
	PrevUntil time.Time
	Disabled  bool

	MaxConns, MaxUserConns int64
	MaxMsg                 int64
	MaxPresence            int
	MaxTokenTTL            time.Duration // 0: no bound
	UserRate, AppRate      Rate          // publishes of one user, of the app (per node)
	// SignalRate: signals of one connection; ReadRate: its read, unread
	// and receipts requests.
	SignalRate, ReadRate Rate

	// Identity: what a token must say beyond its signature ("": not
	// checked; UserClaim "": sub).
	Issuer, Audience, UserClaim string

	// Online: the app's webhook wants online and offline events, so its
	// users' connections count in the app's presence (proto.OnlineRoom).
	Online bool
}

// Resolve builds the view of a against the node's defaults.
func Resolve(lim Limits, a *proto.App) *View {
	o := &a.Limits
	i64 := func(p *int64, def int64) int64 {
		if p != nil {
			return *p
		}
		return def
	}
	f64 := func(p *float64, def float64) float64 {
		if p != nil {
			return *p
		}
		return def
	}
	v := &View{
		ID:           a.ID,
		Disabled:     a.Disabled,
		PrevUntil:    a.PreviousUntil,
		MaxConns:     i64(o.MaxConns, lim.MaxConns),
		MaxUserConns: i64(o.MaxUserConns, lim.MaxUserConns),
		MaxMsg:       i64(o.MaxMsg, lim.MaxMsg),
		MaxPresence:  int(i64(o.MaxPresence, lim.MaxPresence)),
		MaxTokenTTL:  lim.MaxTokenTTL,
	}
	if o.MaxTokenTTL != nil {
		v.MaxTokenTTL = time.Duration(*o.MaxTokenTTL)
	}
	for _, s := range a.Secrets(time.Now()) {
		if s != "" {
			v.Secrets = append(v.Secrets, []byte(s))
		}
	}
	if id := a.Identity; id != nil {
		v.Issuer, v.Audience, v.UserClaim = id.Issuer, id.Audience, id.UserClaim
		if v.UserClaim == "sub" {
			v.UserClaim = ""
		}
	}
	if w := a.Webhook; w != nil && w.URL != "" && !a.Disabled {
		v.Online = w.WantsConnection()
	}
	v.UserRate = NewRate(f64(o.PubRate, lim.PubRate), i64(o.PubBurst, lim.PubBurst))
	v.SignalRate = NewRate(f64(o.SignalRate, lim.SignalRate), i64(o.SignalBurst, lim.SignalBurst))
	v.ReadRate = NewRate(f64(o.ReadRate, lim.ReadRate), i64(o.ReadBurst, lim.ReadBurst))
	ar := f64(o.AppPubRate, lim.AppPubRate)
	v.AppRate = NewRate(ar, int64(math.Ceil(ar)))
	return v
}

// Snapshot is one reading of the app registry resolved once for every
// edge: the registry's apps, with the node's static apps (--app-secret)
// filling in the ids the registry does not hold, each with its View.
// Immutable once built: the node builds one per registry read and hands
// the same one to the loops and the server API.
type Snapshot struct {
	// Entries are in id order.
	Entries []Entry
}

// Entry is one app of a Snapshot.
type Entry struct {
	App  *proto.App // the entry as read (a static app: its id and secret)
	View *View      // App resolved against the node's defaults
}

// NewSnapshot resolves the registry's apps reg, and the static apps
// (id -> secret) it does not hold, against lim.
func NewSnapshot(lim Limits, static map[string][]byte, reg []proto.App) *Snapshot {
	byID := make(map[string]*proto.App, len(reg)+len(static))
	for id, sec := range static {
		byID[id] = &proto.App{ID: id, Secret: string(sec)}
	}
	for i := range reg {
		a := reg[i]
		byID[a.ID] = &a
	}
	s := &Snapshot{Entries: make([]Entry, 0, len(byID))}
	for _, a := range byID {
		s.Entries = append(s.Entries, Entry{App: a, View: Resolve(lim, a)})
	}
	slices.SortFunc(s.Entries, func(x, y Entry) int { return strings.Compare(x.App.ID, y.App.ID) })
	return s
}

// ValidSecrets are the secrets valid at now: the current one, and the
// previous one until PrevUntil (which passes without a registry change).
func (v *View) ValidSecrets(now time.Time) [][]byte {
	if len(v.Secrets) > 1 && !now.Before(v.PrevUntil) {
		return v.Secrets[:1]
	}
	return v.Secrets
}

// SecretMatches compares secret with every secret valid at now in
// constant time (the server API's Bearer secret).
func (v *View) SecretMatches(secret []byte, now time.Time) bool {
	ok := 0
	for _, s := range v.ValidSecrets(now) {
		ok |= subtle.ConstantTimeCompare(s, secret)
	}
	return ok == 1
}

// Rate is a bucket's terms in GCRA: one event per interval ns, tolerance
// ns of credit ((burst-1) intervals). The zero Rate is unlimited.
type Rate struct{ interval, tolerance int64 }

// NewRate turns events per second and a burst into a Rate; a rate that is
// not above 0 is unlimited.
func NewRate(perSec float64, burst int64) Rate {
	if !(perSec > 0) {
		return Rate{}
	}
	interval := max(1, int64(float64(time.Second)/perSec))
	return Rate{interval: interval, tolerance: (max(burst, 1) - 1) * interval}
}

// Take spends one event of a bucket owned by one goroutine (tat, its
// theoretical arrival time) at now: 0 if allowed, else the ns to wait.
// Bucket.Take's rule without the atomic.
func (r Rate) Take(tat *int64, now int64) int64 {
	if r.interval == 0 {
		return 0
	}
	t := max(*tat, now)
	if wait := t - now - r.tolerance; wait > 0 {
		return wait
	}
	*tat = t + r.interval
	return 0
}

// Unlimited reports whether r lets everything through.
func (r Rate) Unlimited() bool { return r.interval == 0 }

// Bucket is one limiter's state: the theoretical arrival time (GCRA), in
// ns of Now. One atomic: lock-free, allocation-free, shared by goroutines
// and event loops alike. The zero Bucket is full.
//
// Why GCRA and not golang.org/x/time/rate, which the server API used:
// both allocate nothing, and this one costs a third. `go test -run NONE
// -bench Limiter -benchmem ./fanout/tenancy/` on the 2-core VM of
// docs/benchmarks.md (Dec 2026, busy with other work; the ratio held over
// runs): gcra 86.7 ns/op, x/time/rate (ReserveN, DelayFrom, CancelAt)
// 228.2 ns/op; from two goroutines at once 117.6 against 369.5 ns/op (a
// CAS against a mutex); 0 B/op and 0 allocs/op for all four.
type Bucket struct{ tat atomic.Int64 }

// Take spends one event at now: 0 if allowed, else the ns to wait before
// it would be. now is ns on the one clock the bucket is always given: Now,
// or a caller's own (the API's per-address buckets take the request's
// time).
func (b *Bucket) Take(now int64, r Rate) int64 {
	if r.interval == 0 {
		return 0
	}
	for {
		old := b.tat.Load()
		t := max(old, now)
		if wait := t - now - r.tolerance; wait > 0 {
			return wait
		}
		if b.tat.CompareAndSwap(old, t+r.interval) {
			return 0
		}
	}
}

// TakeN spends n events at once at now (n >= 1): 0 if all of them are
// allowed, else the ns to wait before they would be; nothing is spent
// then. n above the rate's burst is never allowed (Fits tells).
func (b *Bucket) TakeN(now int64, r Rate, n int64) int64 {
	if r.interval == 0 || n <= 0 {
		return 0
	}
	for {
		old := b.tat.Load()
		t := max(old, now)
		if wait := t + (n-1)*r.interval - now - r.tolerance; wait > 0 {
			return wait
		}
		if b.tat.CompareAndSwap(old, t+n*r.interval) {
			return 0
		}
	}
}

// Fits reports whether n events at once can ever be allowed: n is within
// the burst.
func (r Rate) Fits(n int64) bool {
	return r.interval == 0 || (n-1)*r.interval <= r.tolerance
}

// Full reports whether the bucket has refilled by now: nothing to keep.
func (b *Bucket) Full(now int64) bool { return b.tat.Load() <= now }

// epoch makes Now small and monotonic.
var epoch = time.Now()

// Now is the clock of Take: ns on the monotonic clock.
func Now() int64 { return int64(time.Since(epoch)) }

// RetryAfterMS rounds a wait up to whole milliseconds (at least 1).
func RetryAfterMS(ns int64) int64 {
	return max(1, (ns+int64(time.Millisecond)-1)/int64(time.Millisecond))
}
