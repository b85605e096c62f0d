// Package webhook POSTs an app's committed messages to its backend
// (docs/protocol.md, Webhooks). Each app with a webhook has its own queue
// and its own delivery goroutine with one POST in flight: a slow receiver
// costs only its own app, its events stay in seq order per room, and
// whatever arrived during a POST goes out in the next one, which is how a
// receiver that falls behind gets many events per POST.
//
// Two modes. With PostgreSQL (Config.Store), what is owed is durable: it
// is the messages of each room past the room's cursor (persist, HookRoom),
// committed with the messages themselves, so a crash between commit and
// delivery loses nothing; a node delivers a room while it holds the room's
// lease, advances the cursor once per POST, and turns events older than
// the app's max age into dead letters. The events a node committed itself
// are POSTed from memory (the bytes the commit encoded); anything else
// owed (another node's publishes, a crashed node's rooms) is read from the
// store. Without a database, what is owed lives in this process only, so a
// restart loses it, and the docs say so.
//
// What is held in memory is bounded by bytes, not by count (a count lets
// one app of 32 KB messages hold gigabytes): Config.MaxBytes for the node.
// Without a database, past it the app holding the most loses its oldest
// owed events (counted per app as dropped). With one, an app holds at most
// Config.Window bytes and the node at most MaxBytes; the rest stays in the
// store only and is read back in pages of one batch when its turn comes,
// so nothing is lost and nothing is counted as dropped.
package webhook

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/roost-chat/roost/fanout/hist"
	"github.com/roost-chat/roost/fanout/hooknet"
	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto"
)

// Config bounds the dispatcher.
type Config struct {
	// MaxBytes bounds the bytes of owed events held in memory, all apps
	// of the node (each event counts its frame and eventOverhead). Without
	// a Store, past it the app holding the most in its queue loses its
	// oldest events (counted, logged); a batch in flight is not shed. With
	// a Store, events past it are not held: they are read from the store.
	MaxBytes int64
	// Window bounds the bytes one app holds in memory with a Store.
	Window        int64
	MaxBatch      int           // events per POST at most
	MaxBatchBytes int           // bytes of events per POST at most (one larger event still goes alone)
	MaxAge        time.Duration // default for apps without their own: an event not delivered by then is dropped, or dead-lettered with a Store
	RetryMin      time.Duration // first retry delay; its bound doubles per failure (full jitter)
	RetryMax      time.Duration // longest retry delay
	Client        *http.Client  // nil: a keep-alive client of its own
	Log           *slog.Logger

	// Store makes delivery durable (see the package doc); nil: memory.
	Store *persist.Postgres
	// Owner names this process in the rooms' leases: unique per running
	// node (a restarted node with the same Owner takes its rooms back at
	// once; a new one waits out their leases).
	Owner string
	Lease time.Duration // how long a room's lease lasts unless renewed (default 30s)
	// Sweep is how often the store is asked for owed rooms nobody
	// delivers (a crashed node's, once their leases ran out; messages
	// committed but never handed to a dispatcher): default 5s. Each sweep
	// reads the app's part of the rooms index.
	Sweep time.Duration
	Idle  time.Duration // a room with nothing owed for this long gives its lease up (default 2s)
	// CursorEvery is how often delivered cursors are written (default
	// 100ms): a crash sends up to that much again.
	CursorEvery time.Duration
}

// Defaults are the dispatcher's bounds unless told otherwise.
func Defaults() Config {
	return Config{MaxBytes: 128 << 20, Window: 4 << 20, MaxBatch: 500, MaxBatchBytes: 1 << 20, MaxAge: proto.DefaultWebhookMaxAge,
		RetryMin: 100 * time.Millisecond, RetryMax: time.Minute, Lease: 30 * time.Second, Sweep: 5 * time.Second, Idle: 2 * time.Second, CursorEvery: 100 * time.Millisecond}
}

// Stats are the dispatcher's counters.
type Stats struct {
	Queued    atomic.Uint64 // events taken from commits
	Delivered atomic.Uint64 // events a receiver answered 2xx for
	Posts     atomic.Uint64 // POSTs answered 2xx
	Failures  atomic.Uint64 // POSTs that failed (status, timeout, connection): each is retried
	Dropped   atomic.Uint64 // events lost (memory only): shed past MaxBytes, past MaxAge, or the webhook removed; per app: EachDropped
	Dead      atomic.Uint64 // events past MaxAge recorded as dead letters (durable)
	Read      atomic.Uint64 // events read back from the store (durable: owed but not committed here, or not in memory any more)
	Owed      atomic.Int64  // events queued in memory and not yet delivered, all apps
	ConnSent  atomic.Uint64 // connection events (proto.EventsRoom) among Delivered
	Held      atomic.Int64  // bytes of owed events held in memory, all apps (bounded by MaxBytes, plus a batch in flight per app)
}

// eventOverhead is what one held event costs besides its frame: the event
// itself and its share of the queue's backing array.
const eventOverhead = 96

func (ev *event) size() int64 { return int64(len(ev.frame)) + eventOverhead }

// Dispatcher takes committed messages (Committed) and delivers them to
// the apps' webhooks.
type Dispatcher struct {
	cfg    Config
	log    *slog.Logger
	client *http.Client
	any    atomic.Bool // some app has a webhook: Committed does nothing otherwise
	// lag observes for each delivered event handed over by Committed on
	// this node the seconds from that hand-off to the 2xx of its POST
	// (events read back from the store are not observed):
	// roost_webhook_lag_seconds.
	lag *hist.Histogram

	mu   sync.RWMutex
	apps map[string]*target
	// dropped counts each app's dropped events; an app keeps its counter
	// after its webhook goes (a counter does not go back), so this grows
	// with the apps that ever had one. Under mu.
	dropped map[string]*atomic.Uint64

	shedMu sync.Mutex // one shed at a time: concurrent ones would shed twice

	dropLogged atomic.Int64 // Unix ns of the last drop logged
	Stats      Stats
}

// target is one app's webhook: its settings, queue and delivery goroutine.
type target struct {
	id  string
	cfg atomic.Pointer[hookCfg]

	dropped *atomic.Uint64

	mu    sync.Mutex
	queue []event // owed, oldest first
	bytes int64   // held: the queue's events, and with a Store the delivery goroutine's pending ones
	// spill is, with a Store, the newest seq per room of the events not
	// held (past Window or MaxBytes): the delivery goroutine reads them
	// from the store.
	spill map[string]uint64
	arena []byte // the chunk frames are copied into while the app is behind (own)
	wake  chan struct{}
	stop  chan struct{}
	done  chan struct{}
}

type hookCfg struct {
	hook    proto.Webhook
	app     proto.App // for its secrets, read at each POST (a rotation signs twice)
	timeout time.Duration
	maxAge  time.Duration
}

// event is one message owed. It holds the msg frame the commit encoded
// (shared, immutable), not a copy: the POST writes the event straight from
// it, so queueing an event allocates nothing of its own.
type event struct {
	key   string // app/room
	seq   uint64
	ts    int64  // commit time, Unix ms
	frame []byte // the msg frame (header + JSON), or, read from the store, the msg JSON alone
	at    time.Time
}

// New returns a dispatcher; SetApps gives it the webhooks.
func New(cfg Config) *Dispatcher {
	d := Defaults()
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = d.MaxBytes
	}
	if cfg.Window <= 0 {
		cfg.Window = min(d.Window, cfg.MaxBytes)
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = d.MaxBatch
	}
	if cfg.MaxBatchBytes <= 0 {
		cfg.MaxBatchBytes = d.MaxBatchBytes
	}
	if cfg.MaxAge <= 0 {
		cfg.MaxAge = d.MaxAge
	}
	if cfg.RetryMin <= 0 {
		cfg.RetryMin = d.RetryMin
	}
	if cfg.RetryMax < cfg.RetryMin {
		cfg.RetryMax = max(d.RetryMax, cfg.RetryMin)
	}
	if cfg.Lease <= 0 {
		cfg.Lease = d.Lease
	}
	if cfg.Sweep <= 0 {
		cfg.Sweep = d.Sweep
	}
	if cfg.Idle <= 0 {
		cfg.Idle = d.Idle
	}
	if cfg.CursorEvery <= 0 {
		cfg.CursorEvery = d.CursorEvery
	}
	if cfg.Store != nil && cfg.Owner == "" {
		panic("BUG: webhook: a durable dispatcher needs an Owner")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	c := cfg.Client
	if c == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.DialContext = hooknet.Default.Dialer().DialContext // link-local and the node's own listeners are refused
		tr.MaxIdleConnsPerHost = 4
		// A redirect is the receiver's answer, not a delivery: followed, a
		// 301-303 turns the POST into a GET of another URL whose 2xx would
		// mark the batch delivered while nobody received it.
		c = &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		}}
	}
	return &Dispatcher{cfg: cfg, log: cfg.Log, client: c, apps: map[string]*target{}, dropped: map[string]*atomic.Uint64{},
		lag: hist.New("roost_webhook_lag_seconds", hist.LatencyBuckets)}
}

// Durable reports whether what is owed survives a restart (a Store).
func (d *Dispatcher) Durable() bool { return d.cfg.Store != nil }

// SetApps installs the registry's webhooks (any goroutine). An app that
// gains one starts delivering from its next message; one that loses it
// drops what it owed in memory (logged; with a Store the cursors stay, and
// the messages are owed again if the webhook comes back with those rooms).
func (d *Dispatcher) SetApps(reg []proto.App) {
	d.mu.Lock()
	defer d.mu.Unlock()
	seen := map[string]bool{}
	for i := range reg {
		a := &reg[i]
		if a.Webhook == nil || a.Webhook.URL == "" || a.Disabled {
			continue
		}
		seen[a.ID] = true
		hc := &hookCfg{hook: *a.Webhook, app: *a, timeout: time.Duration(a.Webhook.Timeout), maxAge: time.Duration(a.Webhook.MaxAge)}
		if hc.timeout <= 0 {
			hc.timeout = proto.DefaultWebhookTimeout
		}
		if hc.maxAge <= 0 {
			hc.maxAge = d.cfg.MaxAge
		}
		t := d.apps[a.ID]
		if t == nil {
			dc := d.dropped[a.ID]
			if dc == nil {
				dc = new(atomic.Uint64)
				d.dropped[a.ID] = dc
			}
			t = &target{id: a.ID, dropped: dc, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
			t.cfg.Store(hc)
			d.apps[a.ID] = t
			if d.cfg.Store != nil {
				go d.deliverDurable(t)
			} else {
				go d.deliver(t)
			}
			continue
		}
		t.cfg.Store(hc)
	}
	for id, t := range d.apps {
		if !seen[id] {
			delete(d.apps, id)
			close(t.stop)
		}
	}
	d.any.Store(len(d.apps) > 0)
}

// Close stops every delivery goroutine and waits for them; what is owed
// in memory is lost (with a Store it stays owed in the database).
func (d *Dispatcher) Close() {
	d.mu.Lock()
	ts := make([]*target, 0, len(d.apps))
	for _, t := range d.apps {
		ts = append(ts, t)
	}
	d.mu.Unlock()
	d.SetApps(nil)
	for _, t := range ts {
		<-t.done
	}
}

// Committed takes one new message the publish path committed (fanout
// calls it before the acks go out): its room key, seq, commit time (Unix
// ms) and frame. A message of an app with a webhook that wants its room
// is queued. It never blocks on a receiver, and queues the frame the
// commit encoded rather than a copy of the message.
func (d *Dispatcher) Committed(key string, seq uint64, ts int64, frame []byte) {
	if !d.any.Load() {
		return
	}
	app, room := proto.SplitKey(key)
	d.mu.RLock()
	t := d.apps[app]
	d.mu.RUnlock()
	if t == nil || !t.cfg.Load().hook.Wants(room) {
		return
	}
	d.push(t, event{key: key, seq: seq, ts: ts, frame: frame, at: time.Now()})
}

// WantsEvent reports whether app's webhook wants the connection event e
// of room ("" for online and offline): what fanout asks before it makes
// one (fanout.Parts.ConnEvents). Any goroutine.
func (d *Dispatcher) WantsEvent(e proto.ConnEvent, app, room string) bool {
	if !d.any.Load() {
		return false
	}
	d.mu.RLock()
	t := d.apps[app]
	d.mu.RUnlock()
	return t != nil && t.cfg.Load().hook.WantsEvent(e, room)
}

// msgPrefix starts every msg object; an event is the same object with
// "type" for "op".
const msgPrefix, eventPrefix = `{"op":"msg",`, `{"type":"msg",`

// appendEvent appends ev's event object: the msg object of its frame with
// "type" for "op", copied once, straight into the POST's body; a
// connection event's frame is its event object already (proto.EventsRoom).
func appendEvent(dst []byte, ev *event) []byte {
	b := msgJSON(ev.frame)
	if bytes.HasPrefix(b, []byte(proto.EventPrefix)) {
		return append(dst, b...)
	}
	if !bytes.HasPrefix(b, []byte(msgPrefix)) {
		panic("BUG: webhook: a msg object does not start with " + msgPrefix)
	}
	dst = append(dst, eventPrefix...)
	return append(dst, b[len(msgPrefix):]...)
}

// msgJSON returns the payload of a server (unmasked) text frame, or b
// itself when it is already the JSON object.
func msgJSON(b []byte) []byte {
	if len(b) < 2 || b[0] == '{' {
		return b
	}
	switch n := b[1] & 0x7f; {
	case n < 126:
		return b[2:]
	case n == 126:
		return b[4:]
	default:
		return b[10:]
	}
}

func (d *Dispatcher) push(t *target, ev event) {
	d.Stats.Queued.Add(1)
	sz := ev.size()
	t.mu.Lock()
	if d.cfg.Store != nil && (t.bytes+sz > d.cfg.Window || d.Stats.Held.Load()+sz > d.cfg.MaxBytes) {
		// Stored already: not held, read back when its turn comes.
		if t.spill == nil {
			t.spill = map[string]uint64{}
		}
		t.spill[ev.key] = max(t.spill[ev.key], ev.seq)
		t.mu.Unlock()
		d.wake(t)
		return
	}
	if t.bytes >= ownAbove && len(ev.frame) <= ownMax {
		ev.frame = t.own(ev.frame)
	} else if t.bytes < ownAbove/2 {
		t.arena = nil // caught up: its chunk goes with the last frame in it
	}
	t.queue = append(t.queue, ev)
	t.bytes += sz
	t.mu.Unlock()
	d.Stats.Owed.Add(1)
	if d.Stats.Held.Add(sz) > d.cfg.MaxBytes && d.cfg.Store == nil {
		d.shed()
	}
	d.wake(t)
}

// A small frame shares the commit's arena chunk with other apps' frames,
// and holding it holds the whole chunk: once an app is behind (it holds
// ownAbove bytes), its new frames up to ownMax are copied into chunks of
// its own, so that what it holds is what is counted (a chunk of waste at
// most). An app keeping up holds little and copies nothing.
const (
	ownAbove = 256 << 10
	ownMax   = 16 << 10
	ownChunk = 64 << 10
)

// own copies frame into t's own chunk (t.mu held).
func (t *target) own(frame []byte) []byte {
	if cap(t.arena)-len(t.arena) < len(frame) {
		t.arena = make([]byte, 0, ownChunk)
	}
	start := len(t.arena)
	t.arena = append(t.arena, frame...)
	return t.arena[start:len(t.arena):len(t.arena)]
}

func (d *Dispatcher) wake(t *target) {
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// shed brings the bytes held back under MaxBytes (memory only): the app
// holding the most in its queue loses its oldest events, then the next,
// down to 1/64 under the bound, so that a node at its bound sheds once
// every many publishes rather than on each (each shed looks at every app).
func (d *Dispatcher) shed() {
	d.shedMu.Lock()
	defer d.shedMu.Unlock()
	low := d.cfg.MaxBytes - d.cfg.MaxBytes/64
	for d.Stats.Held.Load() > d.cfg.MaxBytes {
		var big *target
		var most int64
		d.mu.RLock()
		for _, t := range d.apps {
			t.mu.Lock()
			if t.bytes > most {
				big, most = t, t.bytes
			}
			t.mu.Unlock()
		}
		d.mu.RUnlock()
		if big == nil {
			return // all of it in flight: bounded by a batch per app
		}
		over := d.Stats.Held.Load() - low
		big.mu.Lock()
		n, freed := 0, int64(0)
		for n < len(big.queue) && freed < over {
			freed += big.queue[n].size()
			n++
		}
		clear(big.queue[:n])
		big.queue = big.queue[n:]
		big.bytes -= freed
		big.mu.Unlock()
		d.Stats.Held.Add(-freed)
		d.Stats.Owed.Add(-int64(n))
		d.drop(big, n, "past --webhook-backlog: this app held the most, its oldest owed events go")
	}
}

// drop counts n events of t lost and logs it (at most once a second).
func (d *Dispatcher) drop(t *target, n int, why string) {
	if n <= 0 {
		return
	}
	d.Stats.Dropped.Add(uint64(n))
	t.dropped.Add(uint64(n))
	d.logDrop(t.id, why)
}

// EachDropped calls f with each app that ever had a webhook on this node
// and the events it lost, in no order.
func (d *Dispatcher) EachDropped(f func(app string, n uint64)) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	for app, c := range d.dropped {
		f(app, c.Load())
	}
}

// Backlog is one app's owed events as this node holds them.
type Backlog struct {
	App    string
	Owed   int           // events waiting in memory behind the batch being posted
	Bytes  int64         // what they hold
	Oldest time.Duration // age of the oldest of them (0: none)
	Spill  int           // rooms with owed events left in the store (PostgreSQL), read back in pages
}

// EachBacklog calls f with each app that has a webhook on this node, in
// no order: what its delivery still owes and how late it is (the admin
// page's backlog and lag per app, and their metrics).
func (d *Dispatcher) EachBacklog(now time.Time, f func(Backlog)) {
	d.mu.RLock()
	targets := make([]*target, 0, len(d.apps))
	for _, t := range d.apps {
		targets = append(targets, t)
	}
	d.mu.RUnlock()
	for _, t := range targets {
		t.mu.Lock()
		b := Backlog{App: t.id, Owed: len(t.queue), Bytes: t.bytes, Spill: len(t.spill)}
		if len(t.queue) > 0 {
			b.Oldest = now.Sub(t.queue[0].at)
		}
		t.mu.Unlock()
		f(b)
	}
}

// logDrop logs dropped events at most once a second.
func (d *Dispatcher) logDrop(app, why string) {
	now := time.Now().UnixNano()
	last := d.dropLogged.Load()
	if now-last < int64(time.Second) || !d.dropLogged.CompareAndSwap(last, now) {
		return
	}
	d.log.Warn("webhook events dropped", "app", app, "why", why, "dropped_total", d.Stats.Dropped.Load())
}

// deliver is one app's delivery goroutine (memory). The batch it POSTs is
// taken out of the queue, so that shedding (another goroutine) only ever
// removes events nobody is sending; a failed batch is sent again as it is.
func (d *Dispatcher) deliver(t *target) {
	defer close(t.done)
	failures := 0
	var body []byte
	var batch []event
	for {
		if len(batch) == 0 {
			batch = d.takeBatch(t, batch)
		}
		if len(batch) == 0 {
			select {
			case <-t.stop:
				d.dropOwed(t)
				return
			case <-t.wake:
				continue
			}
		}
		hc := t.cfg.Load()
		old := 0
		for old < len(batch) && time.Since(batch[old].at) > hc.maxAge {
			old++
		}
		if old > 0 {
			d.release(batch[:old])
			batch = batch[old:]
			d.drop(t, old, "older than the maximum age: the receiver failed for too long")
			continue
		}
		body = appendBody(body[:0], t.id, batch)
		err := d.post(hc, body)
		if err == nil {
			d.observeLag(batch)
			failures = 0
			d.release(batch)
			d.Stats.Posts.Add(1)
			d.Stats.Delivered.Add(uint64(len(batch)))
			d.countConn(batch)
			batch = batch[:0]
			continue
		}
		d.Stats.Failures.Add(1)
		failures++
		wait := backoff(d.cfg.RetryMin, d.cfg.RetryMax, failures)
		if failures == 1 || failures%10 == 0 {
			d.log.Warn("webhook POST failed; retrying", "app", t.id, "url", hc.hook.URL, "err", err, "failures", failures, "retry_in", wait, "owed", d.owed(t)+len(batch))
		}
		timer := time.NewTimer(wait)
		select {
		case <-t.stop:
			timer.Stop()
			d.release(batch)
			d.drop(t, len(batch), "webhook removed or node stopping")
			d.dropOwed(t)
			return
		case <-timer.C:
		}
	}
}

// countConn counts the connection events of a delivered batch.
func (d *Dispatcher) countConn(batch []event) {
	n := 0
	for i := range batch {
		if isEventsRoom(batch[i].key) {
			n++
		}
	}
	if n > 0 {
		d.Stats.ConnSent.Add(uint64(n))
	}
}

func isEventsRoom(key string) bool {
	_, room := proto.SplitKey(key)
	return room == proto.EventsRoom
}

// takeBatch moves the next batch (MaxBatch events, MaxBatchBytes) out of
// t's queue into dst[:0]; the bytes stay counted in Held until release.
func (d *Dispatcher) takeBatch(t *target, dst []event) []event {
	clear(dst[:cap(dst)])
	dst = dst[:0]
	t.mu.Lock()
	defer t.mu.Unlock()
	n, size := 0, 0
	for n < len(t.queue) && n < d.cfg.MaxBatch && (n == 0 || size+len(t.queue[n].frame) <= d.cfg.MaxBatchBytes) {
		size += len(t.queue[n].frame) + 1
		t.bytes -= t.queue[n].size()
		n++
	}
	dst = append(dst, t.queue[:n]...)
	clear(t.queue[:n])
	t.queue = t.queue[n:]
	if len(t.queue) == 0 {
		t.queue = nil // let the backing array go
	}
	return dst
}

// release forgets held events delivered or dropped (memory mode).
func (d *Dispatcher) release(evs []event) {
	var b int64
	for i := range evs {
		b += evs[i].size()
	}
	d.Stats.Held.Add(-b)
	d.Stats.Owed.Add(-int64(len(evs)))
}

// observeLag reports the lag of a delivered batch's events (d.lag).
func (d *Dispatcher) observeLag(batch []event) {
	now := time.Now()
	for i := range batch {
		if at := batch[i].at; !at.IsZero() {
			d.lag.Observe(now.Sub(at).Seconds())
		}
	}
}

// appendBody appends the POST body of events: {"app":ID,"events":[...]}.
func appendBody(dst []byte, app string, events []event) []byte {
	dst = append(dst, `{"app":`...)
	dst = append(dst, quote(app)...)
	dst = append(dst, `,"events":[`...)
	for i := range events {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendEvent(dst, &events[i])
	}
	return append(dst, "]}"...)
}

// backoff is the delay after the given number of failures in a row: a
// bound of min doubled per failure up to max, and "full jitter" under it
// (uniform in [0, bound]) so that many nodes retrying one receiver spread
// out instead of coming back together.
func backoff(lo, hi time.Duration, failures int) time.Duration {
	d := hi
	if failures < 32 {
		d = min(hi, lo<<(failures-1))
	}
	return rand.N(d + 1)
}

func (d *Dispatcher) owed(t *target) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.queue)
}

func (d *Dispatcher) dropOwed(t *target) {
	t.mu.Lock()
	n := len(t.queue)
	t.queue = nil
	b := t.bytes
	t.bytes = 0
	t.mu.Unlock()
	d.Stats.Held.Add(-b)
	if n > 0 {
		d.Stats.Owed.Add(-int64(n))
		d.Stats.Dropped.Add(uint64(n))
		t.dropped.Add(uint64(n))
		d.log.Warn("webhook removed or node stopping: events owed are dropped", "app", t.id, "events", n)
	}
}

type statusError int

func (e statusError) Error() string { return "receiver answered " + strconv.Itoa(int(e)) }

// post sends one batch, signed with every current secret of the app.
func (d *Dispatcher) post(hc *hookCfg, body []byte) error {
	return post(context.Background(), d.client, hc, body)
}

// Replay POSTs events (a dead letter's JSON array) to the app's webhook
// again, signed with its current secrets: what `roost webhook replay`
// does. A receiver deduplicates by (room, seq) as for any redelivery.
func Replay(ctx context.Context, a proto.App, events []byte) error {
	if a.Webhook == nil || a.Webhook.URL == "" {
		return errors.New("the app has no webhook: set one with roost app set " + a.ID + " --webhook-url URL")
	}
	hc := &hookCfg{hook: *a.Webhook, app: a, timeout: time.Duration(a.Webhook.Timeout)}
	if hc.timeout <= 0 {
		hc.timeout = proto.DefaultWebhookTimeout
	}
	body := append([]byte(`{"app":`+quote(a.ID)+`,"events":`), events...)
	body = append(body, '}')
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DialContext = hooknet.Default.Dialer().DialContext
	return post(ctx, &http.Client{Transport: tr}, hc, body)
}

func post(ctx context.Context, client *http.Client, hc *hookCfg, body []byte) error {
	ctx, cancel := context.WithTimeout(ctx, hc.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, hc.hook.URL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	now := time.Now()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "roost-webhook")
	req.Header.Set("X-Roost-Timestamp", strconv.FormatInt(now.Unix(), 10))
	req.Header.Set("X-Roost-Signature", proto.SignBody(hc.app.Secrets(now), now.Unix(), body))
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	// Read a little of the answer so the connection can be reused.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return statusError(resp.StatusCode)
	}
	return nil
}

func quote(s string) string {
	// App ids match [A-Za-z0-9_.-]: nothing to escape.
	return `"` + s + `"`
}
