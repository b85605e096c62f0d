package pubsub

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"
)

// ShareConns publishes this node's connection count per app and returns
// the other live nodes' counts summed per app. Each node keeps one hash of
// app -> count (expiring after ttl, so a node that died stops counting) and
// its name in a sorted set scored by that expiry. Called about once a
// second by one goroutine; a count is as old as the caller's period.
func (r *Redis) ShareConns(ctx context.Context, node string, mine map[string]int64, ttl time.Duration) (map[string]int64, error) {
	if r.isClosed() {
		return nil, ErrClosed
	}
	c := r.client
	nodes := r.chanPrefix[:len(r.chanPrefix)-2] + ".conns.nodes"
	hash := func(n string) string { return r.chanPrefix[:len(r.chanPrefix)-2] + ".conns.node." + n }
	now := time.Now()
	until := now.Add(ttl).UnixMilli()

	cmds := make(rueidis.Commands, 0, 4)
	cmds = append(cmds, c.B().Del().Key(hash(node)).Build())
	if len(mine) > 0 {
		hs := c.B().Hset().Key(hash(node)).FieldValue()
		for app, n := range mine {
			hs = hs.FieldValue(app, strconv.FormatInt(n, 10))
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
	if err := c.Do(ctx, c.B().Zadd().Key(nodes).ScoreMember().ScoreMember(float64(until), node).Build()).Error(); err != nil {
		return nil, fmt.Errorf("cannot share connection counts: %w", err)
	}
	_ = c.Do(ctx, c.B().Zremrangebyscore().Key(nodes).Min("-inf").Max(strconv.FormatInt(now.UnixMilli(), 10)).Build()).Error()
	live, err := c.Do(ctx, c.B().Zrangebyscore().Key(nodes).Min("("+strconv.FormatInt(now.UnixMilli(), 10)).Max("+inf").Build()).AsStrSlice()
	if err != nil {
		return nil, fmt.Errorf("cannot read the nodes' connection counts: %w", err)
	}
	reads := make(rueidis.Commands, 0, len(live))
	for _, n := range live {
		if n != node {
			reads = append(reads, c.B().Hgetall().Key(hash(n)).Build())
		}
	}
	others := map[string]int64{}
	if len(reads) == 0 {
		return others, nil
	}
	for _, res := range c.DoMulti(ctx, reads...) {
		m, err := res.AsStrMap()
		if err != nil {
			return nil, fmt.Errorf("cannot read the nodes' connection counts: %w", err)
		}
		for app, v := range m {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				others[app] += n
			}
		}
	}
	return others, nil
}
