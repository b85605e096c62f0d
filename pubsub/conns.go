package pubsub

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

// ConnCount is one node's figures for one app, as shared through Redis.
type ConnCount struct {
	Conns int64 // connections open (admitted) on the node
	// Shed: connections the node closed over the cluster-wide limit since
	// the app last was within it. Conns+Shed is what the node held before
	// it closed any, which every node divides the excess by, so a node
	// that closed its share first does not change the others' shares.
	Shed int64
}

// ShareConns publishes this node's connection counts per app and returns
// the other live nodes' counts, by node then app. Each node keeps one
// hash of app -> count (expiring after ttl, so a node that died stops
// counting) and its name in a sorted set scored by that expiry; the set
// itself expires ttl after the last node's share, so nothing stays once
// every node stopped. Called about once a second by one goroutine; a count
// is as old as the caller's period.
func (r *Redis) ShareConns(ctx context.Context, node string, mine map[string]ConnCount, ttl time.Duration) (map[string]map[string]ConnCount, error) {
	if r.isClosed() {
		return nil, ErrClosed
	}
	c := r.client
	nodes := r.connsKey("nodes")
	hash := func(n string) string { return r.connsKey("node." + n) }
	now := time.Now()
	until := now.Add(ttl).UnixMilli()

	cmds := make(rueidis.Commands, 0, 4)
	cmds = append(cmds, c.B().Del().Key(hash(node)).Build())
	if len(mine) > 0 {
		hs := c.B().Hset().Key(hash(node)).FieldValue()
		for app, n := range mine {
			hs = hs.FieldValue(app, formatConnCount(n))
		}
		cmds = append(cmds, hs.Build(), c.B().Pexpire().Key(hash(node)).Milliseconds(ttl.Milliseconds()).Build())
	}
	// Written as separate commands, not one transaction: the keys may sit
	// in different cluster slots. A reader between DEL and HSET sees this
	// node at zero for a moment, which errs towards admitting.
	for _, res := range c.DoMulti(ctx, cmds...) {
		if err := res.Error(); err != nil {
			return nil, fmt.Errorf("cannot share connection counts: %w", err)
		}
	}
	for _, res := range c.DoMulti(ctx,
		c.B().Zadd().Key(nodes).ScoreMember().ScoreMember(float64(until), node).Build(),
		c.B().Pexpire().Key(nodes).Milliseconds(ttl.Milliseconds()).Build()) {
		if err := res.Error(); err != nil {
			return nil, fmt.Errorf("cannot share connection counts: %w", err)
		}
	}
	_ = c.Do(ctx, c.B().Zremrangebyscore().Key(nodes).Min("-inf").Max(strconv.FormatInt(now.UnixMilli(), 10)).Build()).Error()
	live, err := c.Do(ctx, c.B().Zrangebyscore().Key(nodes).Min("("+strconv.FormatInt(now.UnixMilli(), 10)).Max("+inf").Build()).AsStrSlice()
	if err != nil {
		return nil, fmt.Errorf("cannot read the nodes' connection counts: %w", err)
	}
	reads := make(rueidis.Commands, 0, len(live))
	names := make([]string, 0, len(live))
	for _, n := range live {
		if n != node {
			reads = append(reads, c.B().Hgetall().Key(hash(n)).Build())
			names = append(names, n)
		}
	}
	others := map[string]map[string]ConnCount{}
	if len(reads) == 0 {
		return others, nil
	}
	for i, res := range c.DoMulti(ctx, reads...) {
		m, err := res.AsStrMap()
		if err != nil {
			return nil, fmt.Errorf("cannot read the nodes' connection counts: %w", err)
		}
		counts := make(map[string]ConnCount, len(m))
		for app, v := range m {
			if n, ok := parseConnCount(v); ok {
				counts[app] = n
			}
		}
		others[names[i]] = counts
	}
	return others, nil
}

func (r *Redis) connsKey(suffix string) string {
	return r.chanPrefix[:len(r.chanPrefix)-2] + ".conns." + suffix
}

// formatConnCount writes "conns" or "conns/shed".
func formatConnCount(n ConnCount) string {
	s := strconv.FormatInt(n.Conns, 10)
	if n.Shed != 0 {
		s += "/" + strconv.FormatInt(n.Shed, 10)
	}
	return s
}

func parseConnCount(v string) (ConnCount, bool) {
	conns, shed, withShed := strings.Cut(v, "/")
	var n ConnCount
	var err error
	if n.Conns, err = strconv.ParseInt(conns, 10, 64); err != nil {
		return n, false
	}
	if withShed {
		if n.Shed, err = strconv.ParseInt(shed, 10, 64); err != nil {
			return n, false
		}
	}
	return n, true
}
