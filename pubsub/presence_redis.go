package pubsub

import (
	"context"
	"crypto/rand"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/rueidis"
)

// DefaultPresenceLease is how long a node's presence outlives its last
// sign of life: when a node dies, its users leave this long after.
const DefaultPresenceLease = 15 * time.Second

// RedisPresenceConfig are the settings of the Redis presence.
type RedisPresenceConfig struct {
	// Lease: a node that has not renewed its lease for this long is dead,
	// and its users leave (0: DefaultPresenceLease).
	Lease time.Duration
	// Grace: a node that stops cleanly keeps its users this long, so that
	// those who reconnect to another node do not flap (0: none).
	Grace time.Duration
}

// RedisPresence is the Presence of a multi-node deployment, kept in Redis
// next to the broker's channels. Per room (the room key is the hash tag,
// so one room's keys share a slot, on one Redis Cluster shard):
//
//	P.pr.{key}.u         hash: user -> how many nodes have the user in the room
//	P.pr.{key}.n.NODE    set: the room's users on NODE
//	P.pr.{key}.w         set: the nodes with presence subscribers in the room
//
// and per deployment P.pr.nodes (sorted set: node -> lease end, Unix ms)
// and per node P.pr.rooms.NODE (set: the rooms NODE has users or presence
// subscribers in). A
// user's count is HLEN of the room's hash: O(1). One tick's changes of a
// room are one script call (O(1) work per change); every room's calls,
// the lease renewal and the look for dead nodes go in one pipeline: one
// round trip per tick (one per shard in a cluster, sent at once). A dead
// node's rooms are cleaned by whichever node sees its lease ended first;
// the scripts make that idempotent (a node's set is the guard), so two
// nodes doing it at once count nothing twice.
//
// Every key expires keep (presenceKeep) after it was last refreshed: the
// nodes set and the node's room list at each lease renewal, a room's keys
// when a change touches them and, for the rooms on the node's list, at
// least every keep/4 (sweep). While a node lives its keys stay; a dead
// node's are taken out by the first live node that sees its lease ended;
// once every node has stopped, nobody refreshes anything and it all
// expires, the room keys before the nodes set that would find them.
type RedisPresence struct {
	client  rueidis.Client
	prefix  string // P.pr.
	node    string
	lease   time.Duration
	grace   time.Duration
	keep    time.Duration
	renewed time.Time // last lease renewal (the Apply goroutine's)
	started bool      // the lease was taken once: a lost one means we were taken for dead
	swept   time.Time // the last sweep of this node's rooms began (the Apply goroutine's)

	mu     sync.Mutex // loaded
	loaded bool       // scripts loaded on every Redis node
}

var _ Presence = (*RedisPresence)(nil)

// NewPresence returns the Redis presence of this node, on the broker's
// connections.
func (r *Redis) NewPresence(cfg RedisPresenceConfig) *RedisPresence {
	if cfg.Lease <= 0 {
		cfg.Lease = DefaultPresenceLease
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	return &RedisPresence{client: r.client, prefix: r.prefix + ".pr.", node: hex.EncodeToString(id[:]),
		lease: cfg.Lease, grace: cfg.Grace, keep: presenceKeep(cfg.Lease), swept: time.Now()}
}

// presenceKeep is how long a presence key outlives its last refresh: long
// past a dead node's lease (its keys must wait for a live node to take its
// users out), and long enough that refreshing every room's keys, a fourth
// of it, costs little.
func presenceKeep(lease time.Duration) time.Duration { return 8 * lease }

// Node is this node's presence id (random per process).
func (p *RedisPresence) Node() string { return p.node }

// applyScript: KEYS users, node set, watchers; ARGV node, keep (ms), then
// ops "+user", "-user", "w" (watch), "u" (unwatch). Returns {joined, left,
// the node's users in the room plus 1 if it still watches it, or -1 when
// nothing left or unwatched, 1 if some node watches the room (asked only
// when some joined or left) or 0}. The keys' expiry is renewed.
var applyScript = script(`
local joined, left = {}, {}
local leaves = false
for i = 3, #ARGV do
  local a = ARGV[i]
  local op, u = string.sub(a, 1, 1), string.sub(a, 2)
  if op == '+' then
    if redis.call('SADD', KEYS[2], u) == 1 and redis.call('HINCRBY', KEYS[1], u, 1) == 1 then
      joined[#joined + 1] = u
    end
  elseif op == '-' then
    leaves = true
    if redis.call('SREM', KEYS[2], u) == 1 and redis.call('HINCRBY', KEYS[1], u, -1) <= 0 then
      redis.call('HDEL', KEYS[1], u)
      left[#left + 1] = u
    end
  elseif op == 'w' then
    redis.call('SADD', KEYS[3], ARGV[1])
  else
    leaves = true
    redis.call('SREM', KEYS[3], ARGV[1])
  end
end
for k = 1, 3 do
  redis.call('PEXPIRE', KEYS[k], ARGV[2])
end
local watched = 0
if #joined + #left > 0 then
  watched = redis.call('EXISTS', KEYS[3])
end
local size = -1
if leaves then
  size = redis.call('SCARD', KEYS[2]) + redis.call('SISMEMBER', KEYS[3], ARGV[1])
end
return {joined, left, size, watched}
`)

// dropScript ends a node's presence in one room: KEYS users, node set,
// watchers; ARGV node. Returns {the users who left, 1 if some node
// watches the room or 0}.
var dropScript = script(`
local left = {}
for _, u in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  if redis.call('HINCRBY', KEYS[1], u, -1) <= 0 then
    redis.call('HDEL', KEYS[1], u)
    left[#left + 1] = u
  end
end
redis.call('DEL', KEYS[2])
redis.call('SREM', KEYS[3], ARGV[1])
return {left, redis.call('EXISTS', KEYS[3])}
`)

// renewScript: KEYS nodes; ARGV node, lease end. Returns the previous
// lease end (false: none, or taken for dead).
var renewScript = script(`
local old = redis.call('ZSCORE', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
return old
`)

type luaScript struct{ src, sha string }

func script(src string) luaScript {
	h := sha1.Sum([]byte(src))
	return luaScript{src: src, sha: hex.EncodeToString(h[:])}
}

func (p *RedisPresence) evalsha(s luaScript, keys []string, args ...string) rueidis.Completed {
	return p.client.B().Evalsha().Sha1(s.sha).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
}

// load puts the scripts in every Redis node's cache (once, and again
// after a NOSCRIPT: a restarted or new node).
func (p *RedisPresence) load(ctx context.Context, force bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.loaded && !force {
		return nil
	}
	for addr, c := range p.client.Nodes() {
		for _, s := range []luaScript{applyScript, dropScript, renewScript} {
			if err := c.Do(ctx, c.B().ScriptLoad().Script(s.src).Build()).Error(); err != nil {
				return fmt.Errorf("cannot load presence scripts on %s: %w", addr, err)
			}
		}
	}
	p.loaded = true
	return nil
}

func (p *RedisPresence) roomKeys(key, node string) []string {
	base := p.prefix + "{" + key + "}."
	return []string{base + "u", base + "n." + node, base + "w"}
}

func (p *RedisPresence) nodesKey() string            { return p.prefix + "nodes" }
func (p *RedisPresence) roomsKey(node string) string { return p.prefix + "rooms." + node }

// Apply implements Presence: one pipeline for every room's changes, the
// lease (renewed once a fifth of it has passed) and the look for dead
// nodes; a dead node found costs one more round trip to list its rooms,
// then one script per room.
func (p *RedisPresence) Apply(ctx context.Context, changes []PresenceChange) ([]PresenceDiff, error) {
	if err := p.load(ctx, false); err != nil {
		return nil, err
	}
	// Group by room, keeping each room's order.
	type group struct {
		key  string
		args []string
		join bool
	}
	var groups []group
	at := make(map[string]int)
	keepMS := strconv.FormatInt(p.keep.Milliseconds(), 10)
	for i := range changes {
		c := &changes[i]
		g, ok := at[c.Key]
		if !ok {
			g = len(groups)
			at[c.Key] = g
			groups = append(groups, group{key: c.Key, args: []string{p.node, keepMS}})
		}
		gr := &groups[g]
		switch c.Op {
		case PresenceJoin:
			gr.args = append(gr.args, "+"+c.User)
			gr.join = true
		case PresenceLeave:
			gr.args = append(gr.args, "-"+c.User)
		case PresenceWatch:
			gr.args = append(gr.args, "w")
			gr.join = true // listed: its watcher entry is refreshed, and taken out if the node dies
		case PresenceUnwatch:
			gr.args = append(gr.args, "u")
		}
	}
	now := time.Now()
	cmds := make(rueidis.Commands, 0, len(groups)+3)
	var joinedRooms []string
	for i := range groups {
		g := &groups[i]
		cmds = append(cmds, p.evalsha(applyScript, p.roomKeys(g.key, p.node), g.args...))
		if g.join {
			joinedRooms = append(joinedRooms, g.key)
		}
	}
	nRooms := len(cmds)
	if len(joinedRooms) > 0 {
		// Before the lease renewal: a node found dead in between has these
		// rooms listed, and their cleaning is idempotent.
		cmds = append(cmds, p.client.B().Sadd().Key(p.roomsKey(p.node)).Member(joinedRooms...).Build())
	}
	renew := !p.started || now.Sub(p.renewed) >= p.renewEvery()
	if renew {
		end := now.Add(p.lease).UnixMilli()
		cmds = append(cmds, p.evalsha(renewScript, []string{p.nodesKey()}, p.node, strconv.FormatInt(end, 10)))
		cmds = append(cmds, p.client.B().Zrangebyscore().Key(p.nodesKey()).Min("-inf").Max(strconv.FormatInt(now.UnixMilli(), 10)).Limit(0, 16).Build())
		// Last, their answers unread (a failure shows in the renewal's):
		// the nodes set and this node's room list live on.
		keep := p.keep.Milliseconds()
		cmds = append(cmds, p.client.B().Pexpire().Key(p.nodesKey()).Milliseconds(keep).Build(),
			p.client.B().Pexpire().Key(p.roomsKey(p.node)).Milliseconds(keep).Build())
	}

	res := p.client.DoMulti(ctx, cmds...)
	var diffs []PresenceDiff
	var emptied []string
	var firstErr error
	for i := 0; i < nRooms; i++ {
		v, err := res[i].ToArray()
		if err != nil {
			firstErr = cmp(firstErr, p.noScript(ctx, err))
			continue
		}
		if len(v) != 4 {
			firstErr = cmp(firstErr, errors.New("presence script: unexpected answer"))
			continue
		}
		joined, _ := v[0].AsStrSlice()
		left, _ := v[1].AsStrSlice()
		if len(joined)+len(left) > 0 {
			w, _ := v[3].AsInt64()
			diffs = append(diffs, PresenceDiff{Key: groups[i].key, Joined: joined, Left: left, Watched: w == 1})
		}
		if n, _ := v[2].AsInt64(); n == 0 && !groups[i].join {
			emptied = append(emptied, groups[i].key)
		}
	}
	k := nRooms
	if len(joinedRooms) > 0 {
		firstErr = cmp(firstErr, res[k].Error())
		k++
	}
	var dead []string
	if renew {
		err := res[k].Error()
		if err == nil {
			p.renewed = now
			p.started = true
		} else if !rueidis.IsRedisNil(err) {
			firstErr = cmp(firstErr, p.noScript(ctx, err))
		} else {
			if p.started {
				// Our lease was ended by another node (we were silent past
				// it): our users were taken out. The caller re-applies
				// them when told.
				firstErr = cmp(firstErr, ErrPresenceLost)
			}
			p.renewed = now
			p.started = true
		}
		dead, _ = res[k+1].AsStrSlice()
	}
	if len(emptied) > 0 {
		// The node has no user left in these rooms: forget them, so that
		// its list does not grow with every room it ever served.
		if err := p.client.Do(ctx, p.client.B().Srem().Key(p.roomsKey(p.node)).Member(emptied...).Build()).Error(); err != nil {
			firstErr = cmp(firstErr, err)
		}
	}
	for _, d := range dead {
		if d == p.node {
			continue
		}
		left, err := p.drop(ctx, d)
		if err != nil {
			firstErr = cmp(firstErr, err)
			continue
		}
		diffs = append(diffs, left...)
	}
	if renew && now.Sub(p.swept) >= p.keep/4 {
		firstErr = cmp(firstErr, p.sweep(ctx, now))
	}
	return diffs, firstErr
}

// sweep renews the expiry of the keys of every room on this node's list,
// once a fourth of keep has passed since the last complete sweep (one
// SSCAN page and one pipeline per 1,000 rooms). The Apply goroutine.
func (p *RedisPresence) sweep(ctx context.Context, now time.Time) error {
	c, keep := p.client, p.keep.Milliseconds()
	var cursor uint64
	for {
		e, err := c.Do(ctx, c.B().Sscan().Key(p.roomsKey(p.node)).Cursor(cursor).Count(1000).Build()).AsScanEntry()
		if err != nil {
			return fmt.Errorf("cannot refresh the presence keys: %w", err)
		}
		cmds := make(rueidis.Commands, 0, 3*len(e.Elements))
		for _, key := range e.Elements {
			for _, k := range p.roomKeys(key, p.node) {
				cmds = append(cmds, c.B().Pexpire().Key(k).Milliseconds(keep).Build())
			}
		}
		for _, r := range c.DoMulti(ctx, cmds...) {
			if err := r.Error(); err != nil {
				return fmt.Errorf("cannot refresh the presence keys: %w", err)
			}
		}
		if e.Cursor == 0 {
			p.swept = now
			return nil
		}
		cursor = e.Cursor
	}
}

// renewEvery: the lease is renewed once a fifth of it has passed, so that
// four renewals in a row can fail (a Redis failover, a pause) before the
// other nodes take this one for dead.
func (p *RedisPresence) renewEvery() time.Duration { return p.lease / 5 }

// RenewAt implements Presence: the first Apply takes the lease at once;
// after a failed renewal the time is past, and the caller retries at its
// next tick.
func (p *RedisPresence) RenewAt() time.Time {
	if !p.started {
		return time.Now()
	}
	return p.renewed.Add(p.renewEvery())
}

// ErrPresenceLost: this node's lease had ended (another node took it for
// dead and took its users out); the caller applies its presence again.
var ErrPresenceLost = errors.New("pubsub: this node's presence lease had ended")

func cmp(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

func (p *RedisPresence) noScript(ctx context.Context, err error) error {
	if re, ok := rueidis.IsRedisErr(err); ok && re.IsNoScript() {
		_ = p.load(ctx, true)
	}
	return err
}

// drop ends node's presence everywhere: every room it had users in, then
// its lease entry.
func (p *RedisPresence) drop(ctx context.Context, node string) ([]PresenceDiff, error) {
	rooms, err := p.client.Do(ctx, p.client.B().Smembers().Key(p.roomsKey(node)).Build()).AsStrSlice()
	if err != nil {
		return nil, err
	}
	var diffs []PresenceDiff
	if len(rooms) > 0 {
		cmds := make(rueidis.Commands, 0, len(rooms))
		for _, key := range rooms {
			cmds = append(cmds, p.evalsha(dropScript, p.roomKeys(key, node), node))
		}
		for i, r := range p.client.DoMulti(ctx, cmds...) {
			v, err := r.ToArray()
			if err != nil {
				return diffs, p.noScript(ctx, err)
			}
			if len(v) != 2 {
				return diffs, errors.New("presence drop script: unexpected answer")
			}
			left, _ := v[0].AsStrSlice()
			if len(left) > 0 {
				w, _ := v[1].AsInt64()
				diffs = append(diffs, PresenceDiff{Key: rooms[i], Left: left, Watched: w == 1})
			}
		}
	}
	res := p.client.DoMulti(ctx,
		p.client.B().Del().Key(p.roomsKey(node)).Build(),
		p.client.B().Zrem().Key(p.nodesKey()).Member(node).Build())
	for _, r := range res {
		if err := r.Error(); err != nil {
			return diffs, err
		}
	}
	return diffs, nil
}

// Query implements Presence: HLEN and HRANDFIELD in one round trip; the
// names are any limit of the room's users.
func (p *RedisPresence) Query(ctx context.Context, key string, limit int) (int, []string, error) {
	u := p.roomKeys(key, p.node)[0]
	res := p.client.DoMulti(ctx,
		p.client.B().Hlen().Key(u).Build(),
		p.client.B().Hrandfield().Key(u).Count(int64(limit)).Build())
	n, err := res[0].AsInt64()
	if err != nil {
		return 0, nil, fmt.Errorf("cannot read presence of %s: %w", key, err)
	}
	users, err := res[1].AsStrSlice()
	if err != nil && !rueidis.IsRedisNil(err) {
		return 0, nil, fmt.Errorf("cannot read presence of %s: %w", key, err)
	}
	return int(n), users, nil
}

// Count implements Presence (HLEN).
func (p *RedisPresence) Count(ctx context.Context, key string) (int, error) {
	n, err := p.client.Do(ctx, p.client.B().Hlen().Key(p.roomKeys(key, p.node)[0]).Build()).AsInt64()
	if err != nil {
		return 0, fmt.Errorf("cannot read presence of %s: %w", key, err)
	}
	return int(n), nil
}

// Counts implements Presence: one HLEN per room, in one pipeline (rueidis
// sends each to its slot's shard on a cluster).
func (p *RedisPresence) Counts(ctx context.Context, keys []string, counts []int) error {
	if len(keys) == 0 {
		return nil
	}
	cmds := make(rueidis.Commands, len(keys))
	for i, key := range keys {
		cmds[i] = p.client.B().Hlen().Key(p.roomKeys(key, p.node)[0]).Build()
	}
	for i, res := range p.client.DoMulti(ctx, cmds...) {
		n, err := res.AsInt64()
		if err != nil {
			return fmt.Errorf("cannot read presence of %s: %w", keys[i], err)
		}
		counts[i] = int(n)
	}
	return nil
}

// Close implements Presence: the lease is cut to the grace period, so
// that the users of a node stopped cleanly leave then, unless they came
// back on another node meanwhile. Call it before the broker's Close (it
// uses the broker's connections).
func (p *RedisPresence) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	end := time.Now().Add(p.grace).UnixMilli()
	for _, r := range p.client.DoMulti(ctx,
		p.client.B().Zadd().Key(p.nodesKey()).ScoreMember().ScoreMember(float64(end), p.node).Build(),
		// Past the room keys this node's last changes refreshed: the set
		// that finds them must not expire first.
		p.client.B().Pexpire().Key(p.nodesKey()).Milliseconds(p.keep.Milliseconds()).Build()) {
		if err := r.Error(); err != nil {
			return err
		}
	}
	return nil
}
