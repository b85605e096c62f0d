package fanout

import (
	"bytes"
	"context"
	"errors"
	"hash/maphash"
	"sync"
	"time"

	"github.com/roost-chat/roost/proto"
	"github.com/roost-chat/roost/pubsub"
)

// Presence, the node's side. The loops report each live membership as it
// begins and ends (join, leave: a shard lock and a counter); once per
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
func (pr *presence) answer(ctx context.Context, key string) ([]byte, error) {
	now := time.Now().UnixMilli()
	pr.amu.Lock()
	a, ok := pr.answers[key]
	pr.amu.Unlock()
	if ok && now-a.at < presenceTick.Milliseconds() {
		return a.frame, nil
	}
	count, users, err := pr.p.Query(ctx, key, proto.MaxPresenceUsers)
	if err != nil {
		return nil, err
	}
	_, room := proto.SplitKey(key)
	frame := proto.AppendPresenceFrame(nil, []byte(room), count, users)
	pr.amu.Lock()
	pr.answers[key] = presAnswer{frame: frame, at: now}
	pr.amu.Unlock()
	return frame, nil
}

// dropAnswers forgets answers no longer fresh. The presence goroutine.
func (pr *presence) dropAnswers(now int64) {
	pr.amu.Lock()
	for k, a := range pr.answers {
		if now-a.at >= presenceTick.Milliseconds() {
			delete(pr.answers, k)
		}
	}
	pr.amu.Unlock()
}

// presPend is a room's received diff, net: +1 joined, -1 left.
type presPend struct {
	users map[string]int8
	order []string
	last  int64 // ms of the room's last frame
}

func newPresence(n *Node, p pubsub.Presence, grace time.Duration) *presence {
	pr := &presence{n: n, p: p, grace: grace.Milliseconds(), seed: maphash.MakeSeed(),
		pend: make(map[string]*presPend), answers: make(map[string]presAnswer), stop: make(chan struct{}), done: make(chan struct{})}
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
	if u.conns == 1 && !u.queued {
		u.queued = true
		s.dirty = append(s.dirty, presRef{room: r, user: user, u: u})
	}
	if watch {
		r.watchers++
		if !r.wqueued {
			r.wqueued = true
			s.rdirt = append(s.rdirt, r)
		}
	}
	s.mu.Unlock()
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
	if u := r.users[user]; u != nil {
		if u.conns--; u.conns == 0 {
			u.zeroAt = now
			if !u.queued {
				u.queued = true
				s.dirty = append(s.dirty, presRef{room: r, user: user, u: u})
			}
		}
	}
	if watch {
		r.watchers--
		if !r.wqueued {
			r.wqueued = true
			s.rdirt = append(s.rdirt, r)
		}
	}
	s.mu.Unlock()
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
// node. The presence goroutine only.
func (pr *presence) collect(now int64) {
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
				pr.changes = append(pr.changes, pubsub.PresenceChange{Op: pubsub.PresenceJoin, Key: ref.room.key, User: ref.user})
			case u.conns > 0:
				// Back within the grace period: nothing changed anywhere.
			case u.reported && now-u.zeroAt < pr.grace:
				keep = append(keep, ref) // still in its grace period
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

// run is the presence goroutine.
func (pr *presence) run() {
	defer close(pr.done)
	t := time.NewTicker(presenceTick)
	defer t.Stop()
	for {
		select {
		case <-pr.stop:
			return
		case now := <-t.C:
			pr.tick(now.UnixMilli())
		}
	}
}

func (pr *presence) tick(now int64) {
	pr.collect(now)
	pr.apply(now)
	pr.flush(now)
	pr.dropAnswers(now)
}

func (pr *presence) apply(now int64) {
	changes := pr.changes
	if len(pr.retry) > 0 {
		changes = append(pr.retry, pr.changes...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	diffs, err := pr.p.Apply(ctx, changes)
	cancel()
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
	var buf []byte
	for i := range diffs {
		buf = appendPresenceDiff(buf, &diffs[i])
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
// on the broker's goroutine: it only merges into the pending diffs.
func (pr *presence) received(msg []byte) {
	var p *presPend
	for len(msg) > 0 {
		i := bytes.IndexByte(msg, '\n')
		if i < 1 {
			return // malformed: no node sends it
		}
		line := msg[1:i]
		switch msg[0] {
		case 'K':
			p = nil
			key := string(line)
			if pr.watchers(key) == 0 {
				break
			}
			pr.rmu.Lock()
			if p = pr.pend[key]; p == nil {
				p = &presPend{users: make(map[string]int8)}
				pr.pend[key] = p
			}
			pr.rmu.Unlock()
		case '+', '-':
			if p == nil {
				break
			}
			d := int8(1)
			if msg[0] == '-' {
				d = -1
			}
			pr.rmu.Lock()
			u := string(line)
			switch v, ok := p.users[u]; {
			case !ok:
				p.users[u] = d
				p.order = append(p.order, u)
			case v != d:
				delete(p.users, u) // joined and left, or left and back: no change
			}
			pr.rmu.Unlock()
		}
		msg = msg[i+1:]
	}
}

// flush sends each room's pending diff, at most one frame per room per
// presenceEvery. The presence goroutine only.
func (pr *presence) flush(now int64) {
	type out struct {
		key   string
		frame []byte
	}
	var outs []out
	pr.rmu.Lock()
	for key, p := range pr.pend {
		if now-p.last < presenceEvery.Milliseconds() {
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
}

// close stops the presence goroutine and the Presence.
func (pr *presence) close() error {
	close(pr.stop)
	<-pr.done
	return pr.p.Close()
}
