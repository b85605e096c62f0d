package fanout

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto"
	"github.com/roost-chat/roost/pubsub"
)

// Config is what fanout needs of the node's settings. loop.Config embeds
// it, and its Validate checks these fields too (naming their flags).
type Config struct {
	Loops         int           // event loops (at most MaxLoops)
	OutboundLimit int           // pending + unsent bytes per connection before 1013
	MaxRooms      int           // rooms one connection may be in (joins on the way included)
	Readers       int           // goroutines doing store reads (join catch-up, history, repair)
	GapWindow     time.Duration // how long a missing seq may be awaited before repair
	// ReadQueue: store reads waiting for a reader (default 4,096). Past it a
	// history, presence or repair read is answered overloaded, and a
	// join's catch-up waits on its loop for the next tick.
	ReadQueue int
}

// Observer is a histogram as fanout and the loops feed it (a
// *hist.Histogram, which the package recording into it owns and
// registers). Observe must not block or allocate.
type Observer interface{ Observe(v float64) }

// Parts are what a Node is built on, in dependency order: the store, the
// publish pool's settings, and how to build the broker (fanout builds it,
// since the broker delivers to fanout).
type Parts struct {
	Store persist.Store
	Pool  PoolConfig
	// NewBroker builds the broker delivering to h; nil means the
	// in-process broker.
	NewBroker func(h pubsub.Handler) (pubsub.Broker, error)
	Log       *slog.Logger
	// OnControl, when set, receives every control message the broker
	// delivers (proto.ControlKey), from any node, this one included. It
	// runs on the broker's goroutine: it must not block, and msg is valid
	// during the call only.
	OnControl func(msg []byte)
	// OnCommitted, when set, sees every new message the publish pool
	// committed, after the broker and before the sources hear of it (the
	// webhooks take their messages here): its room key, seq, commit time
	// (Unix ms) and the frame encoded once, immutable and shareable. It
	// runs on a publish worker: it must not block.
	OnCommitted func(key string, seq uint64, ts int64, frame []byte)
	// NewPresence builds the node's presence over bus (the broker New
	// built); nil means the node's own counts (localPresence: one node).
	NewPresence func(bus pubsub.Broker) (pubsub.Presence, error)
	// PresenceGrace: a user is left only after this long with no
	// connection in the room (0: DefaultPresenceGrace).
	PresenceGrace time.Duration
	// ConnEvents, when set, says whether app's webhook wants the
	// connection event e of room ("" for online and offline): those are
	// committed to the app's proto.EventsRoom and handed to OnCommitted
	// (connevents.go). It runs on the presence goroutine: it must not
	// block.
	ConnEvents func(e proto.ConnEvent, app, room string) bool
}

// AckPhases are the histograms of the publish path's share of an ack's
// time, one observation per publish answered (committed, duplicate or
// failed). Together with the source's share
// (a loop's inbox and write-out) they add up to the time from Publish to
// the ack on the socket.
type AckPhases struct {
	Queue    Observer // Publish until its worker's gatherer takes it (the worker's queue)
	Pipeline Observer // taken until no commit is in flight (the previous batch's commit)
	Window   Observer // from then until its batch is handed to the committer (the batch window: company awaited)
	Commit   Observer // the batch's CommitBatch (PostgreSQL: the transaction and its WAL flush)
	Answer   Observer // the commit's end until the batch's broker publish begins (encoding, the previous batch's answer)
	Broker   Observer // the batch's broker publish (Redis: one pipelined round trip) and the OnCommitted hook
}

// Stats are fanout's counters, updated without locks.
type Stats struct {
	Joined       atomic.Int64  // live room memberships, all connections
	SlowCloses   atomic.Uint64 // members closed for passing the outbound limit
	Repairs      atomic.Uint64 // store reads to fill a gap
	Replays      atomic.Uint64 // catch-up pages asked by joins with since
	ReplayReads  atomic.Uint64 // store reads those took (shared by the rejoins of a room: ReplayShare)
	GapCloses    atomic.Uint64 // rooms whose members were closed for a gap the store could not fill
	ReadsRefused atomic.Uint64 // store reads refused because the read queue was full (answered overloaded)
	// UnreadRefused: unread requests answered overloaded because their
	// unread worker's queue was full (a flood of them, or a slow store).
	UnreadRefused atomic.Uint64
	// ReceiptsRefused: receipts queries answered overloaded because their
	// receipts worker's queue was full (a flood of them, or a slow store).
	ReceiptsRefused atomic.Uint64
	// CatchupsAbandoned: joins with since whose catch-up could not go on
	// (its store read failed, or retention removed messages under it);
	// each member was closed with 1013 and rejoins. Counted apart from
	// slow consumers, which close with the same code.
	CatchupsAbandoned atomic.Uint64
	// CatchupsDeferred: times a catch-up page found the read queue full and
	// waited on its loop for a tick rather than close the client; a page
	// that waits several ticks counts once for each, so the rate tells how
	// long the readers stayed behind, not how many clients waited.
	CatchupsDeferred atomic.Uint64
	ResumesLost      atomic.Uint64 // joins with since answered recovered:false (the client missed messages)
	BrokerErrors     atomic.Uint64 // broker publishes that failed (each is retried)
	Rebroadcasts     atomic.Uint64 // failed broadcasts that a retry delivered
	BrokerDropped    atomic.Uint64 // failed broadcasts given up: receivers repair from the store
	// PresenceChanges counts per-user presence changes applied (a user's
	// first connection in a room on this node, the end of its last one).
	PresenceChanges atomic.Uint64
	PresenceErrors  atomic.Uint64 // presence ticks whose Apply failed (retried at the next)
	PresenceFrames  atomic.Uint64 // presence_diff frames made (one per room, shared by its subscribers)
	// PresenceWakes counts the presence goroutine's wake-ups: only while
	// changes, grace periods or diffs wait, and for the lease's renewals.
	PresenceWakes atomic.Uint64
	// Signals: deliveries queued for members, deliveries skipped (the
	// member over half its outbound limit, or the broker's or a loop's
	// queue full) and signals refused for the sender's rate.
	SignalsSent    atomic.Uint64
	SignalsSkipped atomic.Uint64
	SignalsLimited atomic.Uint64
	// Read positions: written to the store, coalesced into a later write
	// of the same user and room, checked against the store (a seq beyond
	// the room's newest the node knew), publishes whose position move was
	// dropped (the queue full), and failed writes (retried).
	ReadMarksWritten   atomic.Uint64
	ReadMarksCoalesced atomic.Uint64
	ReadMarksChecked   atomic.Uint64
	ReadLookups        atomic.Uint64 // the store reads those took (a loop's batch of marks: one)
	// ReadPositionLookups: store reads of users' positions a mark needed
	// and the node did not hold (a loop's batch of marks: one).
	ReadPositionLookups atomic.Uint64
	ReadMarksDropped    atomic.Uint64
	ReadSaveErrors      atomic.Uint64
	ReadsLimited        atomic.Uint64 // read, unread and receipts requests refused for the connection's rate

	// The histograms the publish path records into (New sets them to the
	// node's own, registered by RegisterMetrics).
	PublishLatency Observer // seconds from a publish entering to its commit
	BrokerLatency  Observer // seconds one broker Publish of a committed message takes
	// DeliveryLag is seconds from a message's commit (its ts) to its
	// arrival at this node from the broker, sampled one message in 64.
	// Across nodes it includes their clock offset.
	DeliveryLag Observer
	// AckPhases split each publish's time in the publish path (seconds,
	// one observation per publish answered).
	AckPhases AckPhases
}

// Loop is an event loop as fanout reaches it. A loop's Table runs on the
// loop's goroutine only; other goroutines (the broker's, the publish
// workers', the readers) hand it work through Post.
type Loop interface {
	// Post queues ev; the loop runs it with Table.Run on its own
	// goroutine. Any goroutine; must not block.
	Post(ev Event)
	// PostAll queues evs in order, as many Posts would, with at most one
	// wake-up of the loop: the read positions' answers to one batch of
	// marks. Never deliveries or signals. Any goroutine; must not block;
	// evs may be reused once it returns.
	PostAll(evs []Event)
	// Now is the loop's clock, Unix ms.
	Now() int64
}

type eventKind uint8

const (
	evDeliver    eventKind = iota + 1 // key, seq, frame: a message of a room
	evSubscribed                      // key, err: the node's subscription is up (or failed)
	evRoomSeq                         // room, seq, epoch, err: the room's head, read after subscribing
	evReplay                          // member, room, frame (many msg frames), cursor, seq (first read), flags, err: a page of catch-up
	evHistory                         // member, key, frame or err
	evRepair                          // room, held, upto, tail, flags, err: messages read from the store for a gap or a tail
	evReset                           // the broker may have lost messages
	evPresence                        // key, frame: a presence_diff for the room's presence subscribers
	evSignal                          // key, seq (the sender's tag), frame, sse: a signal of a room (signal.go)
	evReadDone                        // member, key, seq, err: the answer to a read mark (readpos.go)
	evUserFrame                       // frame: positions announced for users' connections (readpos.go: appendReadEntry)
	evReceipts                        // key, frame: a receipts frame for the room's receipts subscribers
)

// Event is work for a loop's Table, made by fanout on another goroutine
// and run on the loop (Table.Run). Passed by value: posting one allocates
// nothing once the loop's inbox has grown.
type Event struct {
	kind   eventKind
	tail   bool   // evRepair: a tail read (after a reset), not a gap
	flags  uint8  // evReplay, evRepair: read flags; evReadDone: doneReceipts
	key    string // evDeliver, evSubscribed, evHistory
	seq    uint64 // evDeliver: the message's seq; evRoomSeq: the room's newest; evReplay: the first read
	epoch  string // evRoomSeq: the room's epoch
	upto   uint64 // evRepair: every seq up to this was asked for
	cursor uint64 // evReplay: everything up to this has been read; evReadDone of an unread or receipts query: when it was posted (Stamp; 0: not stamped)
	frame  []byte
	sse    []byte // evDeliver: the message's SSE event, built by the hub when the node has SSE members in the room
	held   []Held
	room   *Room
	member *Member
	err    error
}

// Run does ev on the loop. Loop only.
func (t *Table) Run(ev *Event) {
	switch ev.kind {
	case evDeliver:
		if r := t.rooms[ev.key]; r != nil {
			t.deliver(r, ev.seq, ev.frame, ev.sse)
		}
	case evSubscribed:
		t.subscribed(ev.key, ev.err)
	case evRoomSeq:
		t.activate(ev.room, ev.seq, ev.epoch, ev.err)
	case evReplay:
		t.replayed(ev)
	case evHistory:
		t.historyDone(ev)
	case evRepair:
		t.repaired(ev.room, ev.held, ev.upto, ev.tail, ev.flags&readMore != 0, ev.err)
	case evReset:
		t.reset()
	case evSignal:
		if r := t.rooms[ev.key]; r != nil {
			t.signal(r, ev.seq, ev.frame, ev.sse)
		}
	case evReadDone:
		t.readDone(ev)
	case evUserFrame:
		t.userFrames(ev.frame)
	case evReceipts:
		var event []byte
		for _, m := range t.receipts[ev.key] {
			if m.sse == nil {
				t.enqueue(m, ev.frame)
				continue
			}
			if event == nil {
				event = buildChatEvent(t.arena, "receipts", ev.frame)
			}
			m.sse.events++
			t.enqueue(m, event)
		}
	case evPresence:
		if r := t.rooms[ev.key]; r != nil {
			for _, m := range r.watchers {
				t.enqueue(m, ev.frame)
			}
		}
	}
}

// Node is fanout's node-wide part: the publish path from a decoded publish
// to frames queued on members. It takes publishes from any source
// (Publish), commits them in groups through the Store (commit.go), encodes
// each new message's frame once, hands it to the broker (and retries a
// failed broadcast), answers the source (Origin), and hands every message
// the broker delivers to the loops holding its room, whose Tables keep the
// room's order and repair its gaps from the store.
//
// Lock order: a hub shard lock is never held while calling the broker or a
// Loop (the in-process broker calls back synchronously); nothing else here
// takes a lock on the delivery path.
type Node struct {
	cfg    Config
	log    *slog.Logger
	store  persist.Store
	pool   *pool
	bus    pubsub.Broker
	hub    *hub
	pres   *presence
	events *connEvents
	hists  *histograms
	tables [MaxLoops]atomic.Pointer[Table]

	brokerLogged atomic.Int64 // Unix ns of the last broker error logged
	onControl    func(msg []byte)
	onCommitted  func(key string, seq uint64, ts int64, frame []byte)

	reads   chan readJob
	signals chan signalJob
	pos     *positions
	// rcptRooms counts, per room key, the loops holding a receipts
	// subscriber of the room: the positions goroutine records moves for
	// the receipts frames of those rooms only (movedTo).
	rcptMu    sync.RWMutex
	rcptRooms map[string]int
	sigNode   uint64        // this node's part of its members' signal tags
	sigSerial atomic.Uint32 // the members' part
	// userLoops, when set (SetUserLoops), says which loops hold a user's
	// connections, so that a read position is posted to those only.
	userLoops atomic.Pointer[func(userKey string) uint64]
	replays   *ReplayShare
	retries   chan *rebroadcast
	done      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once

	Stats Stats
}

// monoEpoch anchors publish stamps: time.Since reads the monotonic clock,
// so a wall-clock step cannot produce a negative latency.
var monoEpoch = time.Now()

// New builds the node's publish path on p.Store: the broker, the publish
// pool, the store readers and the rebroadcaster. Close stops them.
func New(cfg Config, p Parts) (*Node, error) {
	switch {
	case cfg.Loops < 1 || cfg.Loops > MaxLoops:
		return nil, fmt.Errorf("fanout: loops %d out of range 1..%d", cfg.Loops, MaxLoops)
	case cfg.Readers < 1:
		return nil, errors.New("fanout: readers must be positive")
	case p.Store == nil:
		return nil, errors.New("fanout: no store")
	}
	if p.Log == nil {
		p.Log = slog.New(slog.DiscardHandler)
	}
	n := &Node{
		cfg:     cfg,
		log:     p.Log,
		store:   p.Store,
		reads:   make(chan readJob, cmp.Or(cfg.ReadQueue, 4096)),
		signals: make(chan signalJob, signalQueue),
		sigNode: signalNode(),
		replays: NewReplayShare(p.Store, replayKeep, replayRooms, replayBytes),
		retries: make(chan *rebroadcast, 8192),
		done:    make(chan struct{}),
	}
	n.replays.reads, n.replays.served = &n.Stats.ReplayReads, &n.Stats.Replays
	n.pos = newPositions(n, p.Store)
	n.hists = newHistograms()
	n.Stats.PublishLatency, n.Stats.BrokerLatency, n.Stats.DeliveryLag = n.hists.publish, n.hists.broker, n.hists.deliveryLag
	n.Stats.AckPhases = n.hists.fanoutAckPhases()
	n.hub = newHub(n, cfg.Loops)
	if p.NewBroker == nil {
		n.bus = pubsub.NewMemory(n)
	} else {
		bus, err := p.NewBroker(n)
		if err != nil {
			return nil, err
		}
		n.bus = bus
	}
	n.hub.sub = n.bus
	n.onCommitted = p.OnCommitted
	if p.OnControl != nil {
		n.onControl = p.OnControl
		// Node-wide and never unsubscribed; the Redis broker keeps it
		// wanted through reconnects.
		n.bus.Subscribe(proto.ControlKey, func(err error) {
			if err != nil {
				n.log.Warn("cannot subscribe to control messages yet; retrying", "err", err)
			}
		})
	}
	var pr pubsub.Presence
	if p.NewPresence != nil {
		var err error
		if pr, err = p.NewPresence(n.bus); err != nil {
			n.bus.Close()
			return nil, err
		}
	}
	if p.PresenceGrace <= 0 {
		p.PresenceGrace = DefaultPresenceGrace
	}
	n.pres = newPresence(n, pr, p.PresenceGrace)
	if pr == nil {
		// No shared Presence: the node's own counts answer.
		n.pres.p = localPresence{n.pres}
	}
	n.events = newConnEvents(n, p.ConnEvents, p.OnCommitted)
	// Node-wide and never unsubscribed, like the control messages.
	n.bus.Subscribe(proto.PresenceKey, func(err error) {
		if err != nil {
			n.log.Warn("cannot subscribe to presence changes yet; retrying", "err", err)
		}
	})
	go n.pres.run()
	p.Pool.reads = n.pos.hand
	n.pool = newPool(p.Store, n.committed, p.Pool)
	for i := 0; i < cfg.Readers; i++ {
		n.wg.Add(1)
		go n.reader()
	}
	n.wg.Add(1)
	go n.rebroadcaster()
	n.wg.Add(1)
	go n.signaller()
	n.bus.Subscribe(proto.ReadKey, func(err error) {
		if err != nil {
			n.log.Warn("cannot subscribe to read positions yet; retrying", "err", err)
		}
	})
	n.wg.Add(1)
	go n.pos.run()
	for _, q := range n.pos.unreadQ {
		if q != nil {
			n.wg.Add(1)
			go n.pos.unreadWorker(q)
		}
	}
	for _, q := range n.pos.rcptQ {
		if q != nil {
			n.wg.Add(1)
			go n.pos.receiptsWorker(q)
		}
	}
	return n, nil
}

// NewTable returns the Table of loop idx, which reaches the loop through
// loop. Call once per loop, on that loop, before it joins any room.
func (n *Node) NewTable(idx int, loop Loop) *Table {
	if idx < 0 || idx >= n.cfg.Loops {
		panic("BUG: fanout: loop index out of range")
	}
	t := newTable(n.cfg.OutboundLimit, 64<<10)
	t.node, t.idx, t.loop = n, idx, loop
	n.tables[idx].Store(t)
	return t
}

// Publish is the one entry of the publish path, for every source. It
// takes req (Key, From, ID, Body and Origin filled) without blocking: on
// success req belongs to the publish path until req.Origin.Published is
// called with its outcome; on error (proto.ErrOverloaded: the queue is
// full; proto.ErrClosed) the caller keeps it and nothing was stored.
func (n *Node) Publish(req *PubRequest) error {
	req.Entered = time.Since(monoEpoch)
	return n.pool.submit(req)
}

// committed is called by the publish pool's answerers with one answered
// batch, in seq order per room, each new message's frame encoded: the
// batch's frames go to the broker first, in one round trip
// (PublishBatch), then each outcome to its source, so an ack always means
// "stored and on its way".
func (n *Node) committed(batch []*PubRequest) {
	now := time.Since(monoEpoch)
	sc := brokerBatchPool.Get().(*brokerBatch)
	for _, req := range batch {
		req.BrokerAt = now
		n.Stats.PublishLatency.Observe((now - req.Entered).Seconds())
		if req.Err == nil && !req.Duplicate {
			sc.pubs = append(sc.pubs, pubsub.Publication{Key: req.Key, Seq: req.Seq, Frame: req.Frame})
			n.ownPublish(req.Key, req.From, req.Seq, req.Tag)
		}
	}
	if k := len(sc.pubs); k > 0 {
		if cap(sc.errs) < k {
			sc.errs = make([]error, k)
		}
		errs := sc.errs[:k]
		t0 := time.Now()
		failed := n.bus.PublishBatch(context.Background(), sc.pubs, errs)
		n.Stats.BrokerLatency.Observe(time.Since(t0).Seconds())
		for i := 0; failed > 0 && i < k; i++ {
			if errs[i] != nil {
				// Stored but not broadcast. Receivers would repair the gap
				// from the store at the room's next message, but a room
				// that goes quiet has none: broadcast again from the side.
				failed--
				p := &sc.pubs[i]
				n.Stats.BrokerErrors.Add(1)
				n.rebroadcastLater(p.Key, p.Seq, p.Frame, errs[i])
			}
		}
		clear(errs)
	}
	clear(sc.pubs)
	sc.pubs = sc.pubs[:0]
	brokerBatchPool.Put(sc)
	if n.onCommitted != nil {
		for _, req := range batch {
			if req.Err == nil && !req.Duplicate {
				n.onCommitted(req.Key, req.Seq, req.TS, req.Frame)
			}
		}
	}
	n.observePhases(batch)
	for _, req := range batch {
		req.Origin.Published(req)
	}
}

// observePhases stamps the batch answered and observes each publish's
// phases in the publish path (AckPhases).
func (n *Node) observePhases(batch []*PubRequest) {
	now := time.Since(monoEpoch)
	a := &n.Stats.AckPhases
	for _, req := range batch {
		req.Answered = now
		if req.CommitEnd == 0 {
			continue // not from the pool (a test's hand-made batch)
		}
		a.Queue.Observe((req.Taken - req.Entered).Seconds())
		a.Pipeline.Observe((req.Idle - req.Taken).Seconds())
		a.Window.Observe((req.Handed - req.Idle).Seconds())
		a.Commit.Observe((req.CommitEnd - req.Handed).Seconds())
		a.Answer.Observe((req.BrokerAt - req.CommitEnd).Seconds())
		a.Broker.Observe((now - req.BrokerAt).Seconds())
	}
}

// brokerBatch is one committed call's broker scratch. Several workers call
// committed at once, so it is pooled rather than owned by the node.
type brokerBatch struct {
	pubs []pubsub.Publication
	errs []error
}

var brokerBatchPool = sync.Pool{New: func() any { return new(brokerBatch) }}

// OnMessage hands a message the broker delivered to every loop holding its
// room (pubsub.Handler). Fast path: one read lock of one hub shard and one
// post per loop.
func (n *Node) OnMessage(key string, seq uint64, frame []byte) {
	switch key {
	case proto.ControlKey:
		if n.onControl != nil {
			n.onControl(frame)
		}
		return
	case proto.PresenceKey:
		n.pres.received(frame)
		return
	case proto.ReadKey:
		n.receivedRead(frame)
		return
	}
	n.hub.OnMessage(key, seq, frame)
}

// Control hands msg to every node's OnControl, this one's included,
// through the broker. Any goroutine; it waits for the broker (one round
// trip to Redis).
func (n *Node) Control(ctx context.Context, msg []byte) error {
	return n.bus.Publish(ctx, proto.ControlKey, 0, msg)
}

// OnReset tells every loop to read its rooms' tails from the store: the
// broker may have lost messages (pubsub.Handler).
func (n *Node) OnReset() { n.hub.OnReset() }

var _ pubsub.Handler = (*Node)(nil)

// PresenceCount is the number of distinct users with a connection joined
// to the room key, on every node. Any goroutine; it may wait for Redis.
func (n *Node) PresenceCount(ctx context.Context, key string) (int, error) {
	return n.pres.p.Count(ctx, key)
}

// PoolStats are the publish pool's counters (metrics).
func (n *Node) PoolStats() PoolStats { return n.pool.stats() }

// Rooms is the number of rooms the node holds.
func (n *Node) Rooms() int { return n.hub.rooms() }

// RoomActivity calls fn with every room the node holds and the messages
// delivered to it on this node so far (the admin page's busiest rooms).
// Any goroutine; fn must not call back into the Node.
func (n *Node) RoomActivity(fn func(key string, msgs uint64)) { n.hub.activity(fn) }

// ClosePublishes stops taking publishes (Publish answers proto.ErrClosed),
// commits what is queued and answers every source. Any goroutine.
func (n *Node) ClosePublishes() { n.pool.close() }

// Close stops the publish path: the pool (if ClosePublishes was not
// called), the readers, the rebroadcaster and the broker. The store is the
// caller's. Call it once the loops take no more work from it.
func (n *Node) Close() error {
	var err error
	n.closeOnce.Do(func() {
		n.pool.close()
		close(n.done)
		n.wg.Wait()
		err = errors.Join(n.pres.close(), n.events.close(), n.bus.Close())
	})
	return err
}

// deliver, subscribed and reset are how the hub reaches the loops.

func (n *Node) deliver(i int, key string, seq uint64, frame, sse []byte) {
	if IsSignal(seq) {
		n.tables[i].Load().loop.Post(Event{kind: evSignal, key: key, seq: seq, frame: frame, sse: sse})
		return
	}
	if i == 0 && seq%64 == 0 {
		// Sampled: a message reaches each holding loop, so measure on
		// loop 0's copy only, one message in 64.
		if ts, ok := proto.FrameTS(frame); ok {
			n.Stats.DeliveryLag.Observe(float64(time.Now().UnixMilli()-ts) / 1000)
		}
	}
	n.tables[i].Load().loop.Post(Event{kind: evDeliver, key: key, seq: seq, frame: frame, sse: sse})
}

func (n *Node) subscribed(i int, key string, err error) {
	n.tables[i].Load().loop.Post(Event{kind: evSubscribed, key: key, err: err})
}

func (n *Node) reset(i int) {
	if t := n.tables[i].Load(); t != nil {
		t.loop.Post(Event{kind: evReset})
	}
}

// rebroadcast is a committed message whose broker publish failed. The
// retries channel holds pointers: its 8,192 slots are made with the node,
// and 80-byte values would be 640 KiB of every node's heap for a queue
// used only while the broker fails (a failed publish allocates instead).
type rebroadcast struct {
	key   string
	seq   uint64
	frame []byte
	tries int
	due   time.Time
}

const (
	rebroadcastTries = 8 // about 25 s of retries with the backoff below
	rebroadcastFirst = 100 * time.Millisecond
	rebroadcastMax   = 5 * time.Second
)

// rebroadcastLater queues a failed broadcast for retry without blocking the
// publish worker. Order does not matter: receivers place messages by seq
// and drop what they already have (a retry that comes after a repair from
// the store is such a duplicate).
func (n *Node) rebroadcastLater(key string, seq uint64, frame []byte, err error) {
	select {
	case n.retries <- &rebroadcast{key: key, seq: seq, frame: frame, due: time.Now().Add(rebroadcastFirst)}:
	default:
		// Retries full: a long broker outage. The broker's reconnect resets
		// every node, which then reads the rooms' tails from the store.
		n.Stats.BrokerDropped.Add(1)
	}
	n.logBrokerError(key, seq, err)
}

// logBrokerError logs a failed broadcast at most once a second: a broker
// outage fails every publish, and one line each would flood the log.
func (n *Node) logBrokerError(key string, seq uint64, err error) {
	now := time.Now().UnixNano()
	last := n.brokerLogged.Load()
	if now-last < int64(time.Second) || !n.brokerLogged.CompareAndSwap(last, now) {
		return
	}
	n.log.Warn("cannot broadcast committed message; retrying", "room", key, "seq", seq, "err", err,
		"failed_total", n.Stats.BrokerErrors.Load())
}

// rebroadcaster retries failed broadcasts. Its timer runs only while
// some are pending: an idle node does not wake for it.
func (n *Node) rebroadcaster() {
	defer n.wg.Done()
	var pending []rebroadcast
	t := time.NewTimer(rebroadcastFirst)
	t.Stop()
	armed := false
	for {
		select {
		case <-n.done:
			t.Stop()
			return
		case r := <-n.retries:
			pending = append(pending, *r)
			if !armed {
				armed = true
				t.Reset(rebroadcastFirst)
			}
		case now := <-t.C:
			armed = false
			keep := pending[:0]
			for _, r := range pending {
				if now.Before(r.due) {
					keep = append(keep, r)
					continue
				}
				err := n.bus.Publish(context.Background(), r.key, r.seq, r.frame)
				if err == nil {
					n.Stats.Rebroadcasts.Add(1)
					continue
				}
				if r.tries++; r.tries >= rebroadcastTries {
					n.Stats.BrokerDropped.Add(1)
					continue
				}
				r.due = now.Add(min(rebroadcastFirst<<r.tries, rebroadcastMax))
				keep = append(keep, r)
			}
			clear(pending[len(keep):])
			pending = keep
			if len(pending) > 0 {
				armed = true
				t.Reset(rebroadcastFirst)
			}
		}
	}
}

// Delivery reports whether ev is a message the broker delivered, and of
// which room. It is the one Event a loop may leave unqueued (its inbox
// full), on condition that it then calls Table.Lost with the key on its
// own goroutine, so the room's tail is read from the store instead.
func (ev *Event) Delivery() (key string, ok bool) { return ev.key, ev.kind == evDeliver }
