package fanout

import (
	"bytes"
	"context"
	"errors"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/roost-chat/roost/proto"
	"github.com/roost-chat/roost/pubsub"
)

// Presence, the node's side. The loops report each live membership as it
// begins and ends (join, leave: a shard lock and a counter); at the next
// presenceTick the presence goroutine turns what changed into per-user
// changes of this node (a user's first connection in a room, the end of
// its last one once the grace period passed with none) and hands them to
// the pubsub.Presence in one Apply (one round trip to Redis). The diffs
// Apply returns go to every node through the broker, in one message per
// tick (proto.PresenceKey); each node gathers the diffs of the rooms it
// has presence subscribers in and sends each room's at most once per
// presenceEvery, encoded once and shared by the room's subscribers on
// every loop.
//
// A room with no presence subscriber costs its counts only: no diff is
// made for it anywhere (Apply returns diffs of watched rooms only), and no
// loop hears of it.
//
// The goroutine ticks only while something waits for it: changes to
// apply, users in their grace period, diffs waiting for their room's next
// frame, answers to forget, a failed Apply to retry. Otherwise it sleeps
// until a loop or the broker pokes it, or until the Presence's lease
// needs renewing (RenewAt; never in process), so that an idle node does
// not wake five times a second for nothing. Ticks stay on the grid of
// presenceTick since the start: what a tick sees and when (a leave at the
// first tick past its grace, a room's diff at the first past its second)
// is what a free-running ticker gave.

const (
	presenceTick  = 200 * time.Millisecond // how often changes are applied
	presenceEvery = time.Second            // at most one presence_diff per room per this
	// DefaultPresenceGrace is how long a user stays present after its last
	// connection in a room ended, so that a page reload does not flap.
	DefaultPresenceGrace = 5 * time.Second
)

// ErrPresenceLimit refuses a join with presence in a room that has the
// app's maximum of presence subscribers on this node.
var ErrPresenceLimit = errors.New("presence subscriber limit of this room reached: join without presence")

type presence struct {
	n     *Node
	p     pubsub.Presence
	grace int64 // ms
	seed  maphash.Seed

	shards [64]presShard

	// The presence goroutine's.
	retry   []pubsub.PresenceChange
	changes []pubsub.PresenceChange
	failLog int64
	start   time.Time // the tick grid's origin

	// poke wakes the presence goroutine when something new waits for a
	// tick; poked stays set from the poke until the next tick collects,
	// so that a burst of joins costs one channel send, not one each.
	poke  chan struct{}
	poked atomic.Bool

	// Diffs received, waiting for their room's next frame.
	rmu  sync.Mutex
	pend map[string]*presPend

	// Presence answers read in the last presenceTick, per room: the
	// members of a big room asking as they join cost one read per tick,
	// not one each (an answer is as fresh as the changes applied anyway).
	amu     sync.Mutex
	answers map[string]presAnswer

	stop chan struct{}
	done chan struct{}
}

type presShard struct {
	mu    sync.Mutex
	rooms map[string]*presRoom
	dirty []presRef // users whose count changed, or that wait out their grace
	rdirt []*presRoom
	_     [32]byte
}

// presRoom is one room's presence on this node.
type presRoom struct {
	key      string
	users    map[string]*presUser
	watchers int  // live presence subscribers on this node's loops
	unrep    int  // users with a live membership whose Join is not applied yet
	watched  bool // Watch applied
	wqueued  bool // in rdirt
}

// presUser is one user of a room on this node.
type presUser struct {
	conns    int32 // live memberships, every loop
	reported bool  // Join applied (and no Leave since)
	queued   bool  // in dirty
	zeroAt   int64 // ms: when conns fell to 0
}

type presRef struct {
	room *presRoom
	user string
	u    *presUser
}

type presAnswer struct {
	frame []byte // immutable, shared by every connection asking
	at    int64  // ms
}

// answer returns the presence frame of key: read less than presenceTick
// ago, or read now. Reader goroutines.
//
// The users who joined on this node since the last tick are not in the
// Presence yet: they are added to what it answers, so that a client asking
// right after its joined (roost.js does, on every join) finds itself and
// whoever joined here before it. (After a restart nothing else holds
// them: with in-process presence the answer was empty until the next
// tick, and the client's snapshot said everyone had left.) Such an answer
// is not kept for others: it is this moment's.
func (pr *presence) answer(ctx context.Context, key string) ([]byte, error) {
	now := time.Now().UnixMilli()
	fresh := pr.unapplied(key, nil) == nil
	pr.amu.Lock()
	a, ok := pr.answers[key]
	pr.amu.Unlock()
	if fresh && ok && now-a.at < presenceTick.Milliseconds() {
		return a.frame, nil
	}
	count, users, err := pr.p.Query(ctx, key, proto.MaxPresenceUsers)
	if err != nil {
		return nil, err
	}
	if local := pr.unapplied(key, nil); len(local) > 0 {
		count, users = mergeLocal(count, users, local)
		_, room := proto.SplitKey(key)
		return proto.AppendPresenceFrame(nil, []byte(room), count, users), nil
	}
	_, room := proto.SplitKey(key)
	frame := proto.AppendPresenceFrame(nil, []byte(room), count, users)
	pr.amu.Lock()
	pr.answers[key] = presAnswer{frame: frame, at: now}
	pr.amu.Unlock()
	pr.wake() // to forget it
	return frame, nil
}

// unapplied appends to dst the users of key with a live membership on this
// node whose Join the Presence has not had yet. Any goroutine: one shard
// lock, and a walk of the room's users only while some are unapplied.
func (pr *presence) unapplied(key string, dst []string) []string {
	s := pr.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.rooms[key]
	if r == nil || r.unrep <= 0 {
		return dst
	}
	for name, u := range r.users {
		if u.conns > 0 && !u.reported {
			dst = append(dst, name)
		}
	}
	return dst
}

// mergeLocal adds this node's unapplied users to a Presence answer. With
// every name in the answer, a user already there (joined on another node)
// is not counted twice; with only some, the count may be one over per such
// user until the next tick applies them.
func mergeLocal(count int, users, local []string) (int, []string) {
	complete := len(users) >= count
	for _, u := range local {
		if complete && slices.Contains(users, u) {
			continue
		}
		count++
		if len(users) < proto.MaxPresenceUsers {
			users = append(users, u)
		}
	}
	return count, users
}

// forgetAnswers drops the kept answers of the rooms changes touched: one
// read before them would miss a join that is no longer the node's to add
// (answer). The presence goroutine.
func (pr *presence) forgetAnswers(changes []pubsub.PresenceChange) {
	pr.amu.Lock()
	defer pr.amu.Unlock()
	if len(pr.answers) == 0 {
		return
	}
	for i := range changes {
		delete(pr.answers, changes[i].Key)
	}
}

// dropAnswers forgets answers no longer fresh and returns when the next
// one will be stale (0: none left). The presence goroutine.
func (pr *presence) dropAnswers(now int64) (next int64) {
	pr.amu.Lock()
	for k, a := range pr.answers {
		if now-a.at >= presenceTick.Milliseconds() {
			delete(pr.answers, k)
			continue
		}
		next = earliest(next, a.at+presenceTick.Milliseconds())
	}
	pr.amu.Unlock()
	return next
}

// earliest is the earlier of two Unix ms deadlines, 0 meaning none.
func earliest(a, b int64) int64 {
	if a == 0 || (b != 0 && b < a) {
		return b
	}
	return a
}

// presPend is a room's received diff, net: +1 joined, -1 left.
type presPend struct {
	users map[string]int8
	order []string
	last  int64 // ms of the room's last frame
}

func newPresence(n *Node, p pubsub.Presence, grace time.Duration) *presence {
	pr := &presence{n: n, p: p, grace: grace.Milliseconds(), seed: maphash.MakeSeed(), start: time.Now(),
		pend: make(map[string]*presPend), answers: make(map[string]presAnswer), poke: make(chan struct{}, 1),
		stop: make(chan struct{}), done: make(chan struct{})}
	for i := range pr.shards {
		pr.shards[i].rooms = make(map[string]*presRoom)
	}
	return pr
}

func (pr *presence) shard(key string) *presShard {
	return &pr.shards[maphash.String(pr.seed, key)%uint64(len(pr.shards))]
}

func (s *presShard) roomLocked(key string) *presRoom {
	r := s.rooms[key]
	if r == nil {
		r = &presRoom{key: key, users: make(map[string]*presUser)}
		s.rooms[key] = r
	}
	return r
}

// join counts a live membership of user in key. Any loop.
func (pr *presence) join(key, user string, watch bool) {
	s := pr.shard(key)
	s.mu.Lock()
	r := s.roomLocked(key)
	u := r.users[user]
	if u == nil {
		u = &presUser{}
		r.users[user] = u
	}
	u.conns++
	if u.conns == 1 && !u.reported {
		r.unrep++
	}
	queued := false
	if u.conns == 1 && !u.queued {
		u.queued, queued = true, true
		s.dirty = append(s.dirty, presRef{room: r, user: user, u: u})
	}
	if watch {
		r.watchers++
		if !r.wqueued {
			r.wqueued, queued = true, true
			s.rdirt = append(s.rdirt, r)
		}
	}
	s.mu.Unlock()
	if queued {
		pr.wake()
	}
}

// wake tells the presence goroutine that something new waits for the
// next tick. Any goroutine; one channel send per tick at most.
func (pr *presence) wake() {
	if !pr.poked.Load() && pr.poked.CompareAndSwap(false, true) {
		select {
		case pr.poke <- struct{}{}:
		default:
		}
	}
}

// leave ends a live membership of user in key. Any loop.
func (pr *presence) leave(key, user string, watch bool, now int64) {
	s := pr.shard(key)
	s.mu.Lock()
	r := s.rooms[key]
	if r == nil {
		s.mu.Unlock()
		panic("BUG: fanout: presence leave of a room never joined")
	}
	queued := false
	if u := r.users[user]; u != nil {
		if u.conns--; u.conns == 0 {
			if !u.reported {
				r.unrep--
			}
			u.zeroAt = now
			if !u.queued {
				u.queued, queued = true, true
				s.dirty = append(s.dirty, presRef{room: r, user: user, u: u})
			}
			// Already queued: the goroutine holds a deadline for it at
			// or before the new end of its grace, and looks again then.
		}
	}
	if watch {
		r.watchers--
		if !r.wqueued {
			r.wqueued, queued = true, true
			s.rdirt = append(s.rdirt, r)
		}
	}
	s.mu.Unlock()
	if queued {
		pr.wake()
	}
}

// watchers is the room's presence subscribers on this node. Any goroutine.
func (pr *presence) watchers(key string) int {
	s := pr.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.rooms[key]; r != nil {
		return r.watchers
	}
	return 0
}

// collect turns what changed since the last tick into changes of this
// node, and returns when the first user still in its grace period ends it
// (0: none). The presence goroutine only.
func (pr *presence) collect(now int64) (next int64) {
	// Before the shards are read: what a loop queues from here on pokes
	// the goroutine again.
	pr.poked.Store(false)
	for i := range pr.shards {
		s := &pr.shards[i]
		s.mu.Lock()
		for _, r := range s.rdirt {
			r.wqueued = false
			switch {
			case r.watchers > 0 && !r.watched:
				r.watched = true
				pr.changes = append(pr.changes, pubsub.PresenceChange{Op: pubsub.PresenceWatch, Key: r.key})
			case r.watchers == 0 && r.watched:
				r.watched = false
				pr.changes = append(pr.changes, pubsub.PresenceChange{Op: pubsub.PresenceUnwatch, Key: r.key})
			}
			s.dropIfIdleLocked(r)
		}
		clear(s.rdirt)
		s.rdirt = s.rdirt[:0]
		keep := s.dirty[:0]
		for _, ref := range s.dirty {
			u := ref.u
			switch {
			case u.conns > 0 && !u.reported:
				u.reported = true
				ref.room.unrep--
				pr.changes = append(pr.changes, pubsub.PresenceChange{Op: pubsub.PresenceJoin, Key: ref.room.key, User: ref.user})
			case u.conns > 0:
				// Back within the grace period: nothing changed anywhere.
			case u.reported && now-u.zeroAt < pr.grace:
				keep = append(keep, ref) // still in its grace period
				next = earliest(next, u.zeroAt+pr.grace)
				continue
			default:
				if u.reported {
					pr.changes = append(pr.changes, pubsub.PresenceChange{Op: pubsub.PresenceLeave, Key: ref.room.key, User: ref.user})
				}
				delete(ref.room.users, ref.user)
				s.dropIfIdleLocked(ref.room)
			}
			u.queued = false
		}
		clear(s.dirty[len(keep):])
		s.dirty = keep
		s.mu.Unlock()
	}
	return next
}

// all appends this node's whole presence as changes: every reported user
// and every watched room.
func (pr *presence) all(dst []pubsub.PresenceChange) []pubsub.PresenceChange {
	for i := range pr.shards {
		s := &pr.shards[i]
		s.mu.Lock()
		for key, r := range s.rooms {
			if r.watched {
				dst = append(dst, pubsub.PresenceChange{Op: pubsub.PresenceWatch, Key: key})
			}
			for name, u := range r.users {
				if u.reported {
					dst = append(dst, pubsub.PresenceChange{Op: pubsub.PresenceJoin, Key: key, User: name})
				}
			}
		}
		s.mu.Unlock()
	}
	return dst
}

func (s *presShard) dropIfIdleLocked(r *presRoom) {
	if len(r.users) == 0 && r.watchers == 0 && !r.watched && !r.wqueued && s.rooms[r.key] == r {
		delete(s.rooms, r.key)
	}
}

// run is the presence goroutine: a tick at the next grid point after a
// poke, and at the grid point at or after the earliest deadline a tick
// leaves behind; no timer at all when none is left.
func (pr *presence) run() {
	defer close(pr.done)
	t := time.NewTimer(time.Hour)
	t.Stop()
	var at time.Duration // when t fires, since pr.start; 0: not armed
	arm := func(wait time.Duration, grid bool) {
		due := time.Since(pr.start) + max(wait, 1)
		if grid {
			// The first grid point at least wait from now.
			due = (due + presenceTick - 1) / presenceTick * presenceTick
		}
		if at != 0 && at <= due {
			return
		}
		at = due
		t.Reset(due - time.Since(pr.start))
	}
	// The lease: taken (and dead nodes looked for) at the first tick, as
	// before any change, then renewed when the Presence asks, to the
	// millisecond rather than on the grid (a renewal just past a grid
	// point would wait for the next one).
	lease := func() {
		if r := pr.p.RenewAt(); !r.IsZero() {
			wait := time.Until(r)
			arm(wait, wait <= 0)
		}
	}
	lease()
	for {
		select {
		case <-pr.stop:
			t.Stop()
			return
		case <-pr.poke:
			pr.n.Stats.PresenceWakes.Add(1)
			arm(0, true)
		case <-t.C:
			pr.n.Stats.PresenceWakes.Add(1)
			at = 0
			now := time.Now()
			if next := pr.tick(now.UnixMilli()); next != 0 {
				arm(time.Duration(next-now.UnixMilli())*time.Millisecond, true)
			}
			lease()
		}
	}
}

// tick applies what waits and returns the earliest deadline it leaves
// behind, in Unix ms (0: none; the lease's renewal is the Presence's).
func (pr *presence) tick(now int64) (next int64) {
	next = pr.collect(now)
	if len(pr.changes) > 0 || len(pr.retry) > 0 || pr.renewDue() {
		pr.apply(now)
	}
	if len(pr.retry) > 0 {
		next = earliest(next, now) // at the next tick
	}
	next = earliest(next, pr.flush(now))
	return earliest(next, pr.dropAnswers(now))
}

// renewDue: the Presence's lease wants an Apply, changes or not (on the
// monotonic clock, as the Presence counts it).
func (pr *presence) renewDue() bool {
	r := pr.p.RenewAt()
	return !r.IsZero() && !r.After(time.Now())
}

func (pr *presence) apply(now int64) {
	changes := pr.changes
	if len(pr.retry) > 0 {
		changes = append(pr.retry, pr.changes...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	diffs, err := pr.p.Apply(ctx, changes)
	cancel()
	pr.forgetAnswers(changes)
	pr.n.Stats.PresenceChanges.Add(uint64(len(pr.changes)))
	if errors.Is(err, pubsub.ErrPresenceLost) {
		pr.n.log.Warn("presence lease had ended (this node was silent past it): applying this node's presence again")
		clear(pr.retry)
		pr.retry = pr.all(pr.retry[:0])
	} else if err != nil {
		pr.n.Stats.PresenceErrors.Add(1)
		// Changes are idempotent: the next tick applies them again.
		pr.retry = append(pr.retry[:0], changes...)
		if now-pr.failLog >= 10_000 {
			pr.failLog = now
			pr.n.log.Warn("cannot apply presence changes; retrying", "changes", len(changes), "err", err)
		}
	} else {
		clear(pr.retry)
		pr.retry = pr.retry[:0]
	}
	clear(pr.changes)
	pr.changes = pr.changes[:0]
	if len(diffs) == 0 {
		return
	}
	// Every transition, watched or not, may be a connection event.
	pr.n.events.transitions(diffs, now)
	var buf []byte
	for i := range diffs {
		if diffs[i].Watched {
			buf = appendPresenceDiff(buf, &diffs[i])
		}
	}
	if len(buf) == 0 {
		return
	}
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	err = pr.n.bus.Publish(ctx, proto.PresenceKey, 0, buf)
	cancel()
	if err != nil {
		pr.n.log.Warn("cannot broadcast presence changes", "rooms", len(diffs), "err", err)
	}
}

// appendPresenceDiff encodes a diff as "K<key>\n" then "+<user>\n" or
// "-<user>\n" each: neither keys nor user ids hold a control character
// (proto.ValidRoom, proto.ValidUser).
func appendPresenceDiff(dst []byte, d *pubsub.PresenceDiff) []byte {
	dst = append(dst, 'K')
	dst = append(dst, d.Key...)
	dst = append(dst, '\n')
	for _, u := range d.Joined {
		dst = append(append(append(dst, '+'), u...), '\n')
	}
	for _, u := range d.Left {
		dst = append(append(append(dst, '-'), u...), '\n')
	}
	return dst
}

// received takes a broker message of presence diffs (any node's). It runs
// on the broker's goroutine: it only merges into the pending diffs. A
// room's entry is found and its users merged in one hold of rmu: a flush
// in between (the node's own diffs come back while its tick runs) would
// forget the entry as empty, and the users merged after would sit on an
// entry no flush sees again, never sent.
func (pr *presence) received(msg []byte) {
	var p *presPend
	merged, locked := false, false
	for len(msg) > 0 {
		i := bytes.IndexByte(msg, '\n')
		if i < 1 {
			break // malformed: no node sends it
		}
		line := msg[1:i]
		switch msg[0] {
		case 'K':
			p = nil
			if locked {
				pr.rmu.Unlock()
				locked = false
			}
			key := string(line)
			if pr.watchers(key) == 0 {
				break
			}
			pr.rmu.Lock()
			locked = true
			if p = pr.pend[key]; p == nil {
				p = &presPend{users: make(map[string]int8)}
				pr.pend[key] = p
			}
		case '+', '-':
			if p == nil {
				break
			}
			d := int8(1)
			if msg[0] == '-' {
				d = -1
			}
			u := string(line)
			switch v, ok := p.users[u]; {
			case !ok:
				p.users[u] = d
				p.order = append(p.order, u)
			case v != d:
				delete(p.users, u) // joined and left, or left and back: no change
			}
			merged = true
		}
		msg = msg[i+1:]
	}
	if locked {
		pr.rmu.Unlock()
	}
	if merged {
		pr.wake()
	}
}

// flush sends each room's pending diff, at most one frame per room per
// presenceEvery, and returns when the next room's second ends (0: no room
// waits). The presence goroutine only.
func (pr *presence) flush(now int64) (next int64) {
	type out struct {
		key   string
		frame []byte
	}
	var outs []out
	pr.rmu.Lock()
	for key, p := range pr.pend {
		if now-p.last < presenceEvery.Milliseconds() {
			if len(p.users) > 0 {
				next = earliest(next, p.last+presenceEvery.Milliseconds())
			}
			// An empty one only keeps the room's last frame, for a diff
			// that comes within the second; a later tick forgets it.
			continue
		}
		if len(p.users) == 0 {
			delete(pr.pend, key)
			continue
		}
		var joined, left []string
		for _, u := range p.order {
			v := p.users[u]
			delete(p.users, u) // a user may be in order twice
			switch v {
			case 1:
				joined = append(joined, u)
			case -1:
				left = append(left, u)
			}
		}
		clear(p.order)
		p.order = p.order[:0]
		p.last = now
		if len(joined)+len(left) == 0 {
			continue
		}
		_, room := proto.SplitKey(key)
		outs = append(outs, out{key, proto.AppendPresenceDiffFrame(nil, []byte(room), joined, left)})
		pr.n.Stats.PresenceFrames.Add(1)
	}
	pr.rmu.Unlock()
	// Encoded once per room, shared by every loop's subscribers.
	for _, o := range outs {
		pr.n.hub.each(o.key, func(i int) {
			pr.n.tables[i].Load().loop.Post(Event{kind: evPresence, key: o.key, frame: o.frame})
		})
	}
	return next
}

// close stops the presence goroutine and the Presence.
func (pr *presence) close() error {
	close(pr.stop)
	<-pr.done
	return pr.p.Close()
}
