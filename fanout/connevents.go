package fanout

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	vm "github.com/VictoriaMetrics/metrics"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto"
	"github.com/roost-chat/roost/pubsub"
)

// Connection events (docs/protocol.md, Connection events). The presence
// machinery already finds, across nodes and without reload flaps, each
// user's first connection in a room and the end of its last one (grace,
// leases): every transition is returned by pubsub.Presence.Apply to
// exactly one node, the one whose change made it, or the one that ended a
// dead node's lease. A user's connections to an app count as a presence in
// the app's pseudo-room proto.OnlineRoom (Node.Online, called by the loops
// only for apps that want connection events), so online and offline are
// the same transitions of that room.
//
// The presence goroutine hands the transitions an app's webhook wants to
// the events goroutine here, which commits them in order, as messages of
// the app's proto.EventsRoom (one store batch per round, the event's JSON
// as the body), and hands each new one to OnCommitted as the webhooks'
// "frame". From there they are owed exactly as messages are: with
// PostgreSQL, durably (the webhook pipeline delivers what lies past the
// room's cursor, whichever node committed it, a crashed one included);
// without one, in this process's memory only.
//
// Order: one goroutine commits a node's events, batch after batch in the
// order of the transitions, so one app's events from one node have
// increasing seqs. Two nodes' events of one user are apart by at least the
// presence grace (the second node's join made the count 2; its leave ends
// at least a grace later), far more than the commit of the first.

// ConnEventStats are the counters of connection events on this node.
type ConnEventStats struct {
	// Made counts the transitions an app wanted, by proto.ConnEvent.
	Made [5]atomic.Uint64
	// Committed counts events stored and handed to the webhooks.
	Committed atomic.Uint64
	// Dropped counts events lost: the queue past maxEventQueue (the store
	// unreachable for long), or refused by the store (the app's room
	// limit).
	Dropped atomic.Uint64
	// Errors counts store commits that failed (each is retried).
	Errors atomic.Uint64
	// Owed is the events made and not yet committed.
	Owed atomic.Int64
}

const (
	// eventBatch bounds the events of one commit.
	eventBatch = 1000
	// maxEventQueue bounds the events waiting for the store: a store down
	// for long costs at most this much memory (about 100 bytes each), the
	// oldest events going first, counted in Dropped.
	maxEventQueue = 1 << 20
	eventFrom     = "roost" // the sender of every event row
)

type connEvent struct {
	key  string // app/~events
	body []byte // the event's JSON
}

type connEvents struct {
	wants       func(e proto.ConnEvent, app, room string) bool // nil: no app wants any
	store       persist.Store
	onCommitted func(key string, seq uint64, ts int64, frame []byte)
	log         interface {
		Warn(msg string, args ...any)
	}
	idPrefix string // unique per process: ids are idPrefix + serial
	serial   uint64 // the events goroutine's

	mu    sync.Mutex
	queue []connEvent
	wake  chan struct{}
	stop  chan struct{}
	done  chan struct{}

	Stats ConnEventStats
}

func newConnEvents(n *Node, wants func(e proto.ConnEvent, app, room string) bool, onCommitted func(string, uint64, int64, []byte)) *connEvents {
	var id [6]byte
	_, _ = rand.Read(id[:])
	ce := &connEvents{wants: wants, store: n.store, onCommitted: onCommitted, log: n.log,
		idPrefix: "ev-" + hex.EncodeToString(id[:]) + "-",
		wake:     make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	if wants == nil {
		close(ce.done)
		return ce
	}
	go ce.run()
	return ce
}

// transitions takes one Apply's diffs and queues the events the apps
// want, in the order online, joined, left, offline: a user who connects
// and joins in one tick is online before it is in the room, and out of
// its rooms before it is offline. The presence goroutine only.
func (ce *connEvents) transitions(diffs []pubsub.PresenceDiff, now int64) {
	if ce == nil || ce.wants == nil || len(diffs) == 0 {
		return
	}
	var evs []connEvent
	for _, e := range [...]proto.ConnEvent{proto.EventOnline, proto.EventJoined, proto.EventLeft, proto.EventOffline} {
		for i := range diffs {
			d := &diffs[i]
			app, room := proto.SplitKey(d.Key)
			online := room == proto.OnlineRoom
			if online != (e == proto.EventOnline || e == proto.EventOffline) {
				continue
			}
			users := d.Joined
			if e == proto.EventLeft || e == proto.EventOffline {
				users = d.Left
			}
			if len(users) == 0 {
				continue
			}
			if online {
				room = ""
			}
			if !ce.wants(e, app, room) {
				continue
			}
			key := proto.RoomKey(app, proto.EventsRoom)
			for _, u := range users {
				evs = append(evs, connEvent{key: key, body: proto.AppendConnEvent(nil, e, room, u, now)})
			}
			ce.Stats.Made[e].Add(uint64(len(users)))
		}
	}
	if len(evs) == 0 {
		return
	}
	ce.mu.Lock()
	ce.queue = append(ce.queue, evs...)
	drop := len(ce.queue) - maxEventQueue
	if drop > 0 {
		clear(ce.queue[:drop])
		ce.queue = ce.queue[drop:]
	}
	ce.mu.Unlock()
	ce.Stats.Owed.Add(int64(len(evs)))
	if drop > 0 {
		ce.Stats.Owed.Add(-int64(drop))
		ce.Stats.Dropped.Add(uint64(drop))
		ce.log.Warn("connection events dropped: the store has not taken them for too long", "dropped", drop)
	}
	select {
	case ce.wake <- struct{}{}:
	default:
	}
}

// run is the events goroutine: it commits what is queued, a batch at a
// time, retrying a failed batch as it was (the same ids: a commit that
// succeeded unseen is not stored twice).
func (ce *connEvents) run() {
	defer close(ce.done)
	var rows []*persist.Row
	failures := 0
	for {
		if len(rows) == 0 {
			rows = ce.take(rows)
		}
		if len(rows) == 0 {
			select {
			case <-ce.stop:
				ce.drain(rows)
				return
			case <-ce.wake:
				continue
			}
		}
		if ce.commit(rows) {
			failures = 0
			clear(rows)
			rows = rows[:0]
			continue
		}
		failures++
		wait := min(100*time.Millisecond<<min(failures-1, 6), 5*time.Second)
		t := time.NewTimer(wait)
		select {
		case <-ce.stop:
			t.Stop()
			if ce.commit(rows) {
				ce.drain(rows[:0])
			}
			return
		case <-t.C:
		}
	}
}

// drain commits what is queued at the stop, once: what the store does
// not take then is lost with the process (with PostgreSQL, only what was
// never committed).
func (ce *connEvents) drain(rows []*persist.Row) {
	for {
		clear(rows)
		if rows = ce.take(rows[:0]); len(rows) == 0 || !ce.commit(rows) {
			return
		}
	}
}

// take moves the next batch of queued events into rows.
func (ce *connEvents) take(rows []*persist.Row) []*persist.Row {
	ce.mu.Lock()
	n := min(len(ce.queue), eventBatch)
	evs := ce.queue[:n:n]
	ce.queue = ce.queue[n:]
	if len(ce.queue) == 0 {
		ce.queue = nil
	}
	ce.mu.Unlock()
	for i := range evs {
		ce.serial++
		rows = append(rows, &persist.Row{Key: evs[i].key, From: eventFrom,
			ID: strconv.AppendUint([]byte(ce.idPrefix), ce.serial, 36), Body: evs[i].body})
	}
	return rows
}

// commit stores rows and hands the new ones to the webhooks; it reports
// whether the batch is done with (stored, or refused for good).
func (ce *connEvents) commit(rows []*persist.Row) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err := ce.store.CommitBatch(ctx, rows)
	cancel()
	if err != nil && !errors.Is(err, proto.ErrRoomLimit) {
		ce.Stats.Errors.Add(1)
		ce.log.Warn("cannot commit connection events; retrying", "events", len(rows), "err", err)
		return false
	}
	for _, r := range rows {
		switch {
		case r.Err != nil:
			ce.Stats.Dropped.Add(1)
			ce.log.Warn("connection event refused by the store", "room", r.Key, "err", r.Err)
		case r.Duplicate:
			// Stored by an attempt that failed unseen: owed in the store,
			// read back from there by the webhook pipeline.
			ce.Stats.Committed.Add(1)
		default:
			ce.Stats.Committed.Add(1)
			if ce.onCommitted != nil {
				ce.onCommitted(r.Key, r.Seq, r.TS, r.Body)
			}
		}
	}
	ce.Stats.Owed.Add(-int64(len(rows)))
	return true
}

// close stops the events goroutine after one last commit of what waits.
func (ce *connEvents) close() error {
	select {
	case <-ce.done:
		return nil
	default:
	}
	close(ce.stop)
	<-ce.done
	return nil
}

// Online counts one more (on) or one fewer connection of user to app on
// this node, in the app's presence (proto.OnlineRoom): the first one on
// any node makes the online event, the end of the last one on every node,
// once the presence grace has passed with none, the offline event. The
// loops call it on a user's first connection to the app on this node and
// the end of its last one, for apps whose webhook wants connection events.
// Any goroutine.
func (n *Node) Online(app, user string, on bool) {
	key := proto.RoomKey(app, proto.OnlineRoom)
	if on {
		n.pres.join(key, user, false)
	} else {
		n.pres.leave(key, user, false, time.Now().UnixMilli())
	}
}

// ConnEventStats are the counters of connection events (metrics).
func (n *Node) ConnEventStats() *ConnEventStats { return &n.events.Stats }

// writeMetrics writes the connection events' series: transitions an app
// wanted, per type, on the node that found them; events committed,
// dropped and owed (found, not committed yet); commits failed.
func (ce *connEvents) writeMetrics(w io.Writer) {
	vm.WriteMetadataIfNeeded(w, "roost_conn_events_total", "counter")
	for _, e := range [...]proto.ConnEvent{proto.EventOnline, proto.EventJoined, proto.EventLeft, proto.EventOffline} {
		fmt.Fprintf(w, "roost_conn_events_total{type=%q} %d\n", e.String(), ce.Stats.Made[e].Load())
	}
	vm.WriteCounterUint64(w, "roost_conn_events_committed_total", ce.Stats.Committed.Load())
	vm.WriteCounterUint64(w, "roost_conn_events_dropped_total", ce.Stats.Dropped.Load())
	vm.WriteCounterUint64(w, "roost_conn_events_commit_errors_total", ce.Stats.Errors.Load())
	vm.WriteMetadataIfNeeded(w, "roost_conn_events_owed", "gauge")
	fmt.Fprintf(w, "roost_conn_events_owed %d\n", ce.Stats.Owed.Load())
}
