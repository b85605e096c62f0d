package pubsub

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"
)

// The admin page's view of the cluster: each node watched by an operator
// keeps its status (a small JSON document) under a key of its own that
// expires after ttl, and its name in a sorted set scored by that expiry,
// which itself expires with the last node. A node not watched writes
// nothing; a page that opens raises the watch key, which the nodes read.

func (r *Redis) statusKey(suffix string) string {
	return r.chanPrefix[:len(r.chanPrefix)-2] + ".admin." + suffix
}

// ShareStatus stores this node's status for ttl and returns the statuses
// of the other live nodes. Called about once a second by one goroutine.
func (r *Redis) ShareStatus(ctx context.Context, node string, status []byte, ttl time.Duration) ([][]byte, error) {
	if r.isClosed() {
		return nil, ErrClosed
	}
	c := r.client
	nodes := r.statusKey("nodes")
	now := time.Now()
	until := now.Add(ttl).UnixMilli()
	cmds := rueidis.Commands{
		c.B().Set().Key(r.statusKey("node." + node)).Value(rueidis.BinaryString(status)).PxMilliseconds(ttl.Milliseconds()).Build(),
		c.B().Zadd().Key(nodes).ScoreMember().ScoreMember(float64(until), node).Build(),
		c.B().Pexpire().Key(nodes).Milliseconds(ttl.Milliseconds()).Build(),
		c.B().Zremrangebyscore().Key(nodes).Min("-inf").Max(strconv.FormatInt(now.UnixMilli(), 10)).Build(),
		c.B().Zrange().Key(nodes).Min("0").Max("-1").Build(),
	}
	// Separate commands, not a transaction: in a Redis Cluster the keys
	// sit in different slots.
	res := c.DoMulti(ctx, cmds...)
	for _, x := range res[:4] {
		if err := x.Error(); err != nil {
			return nil, fmt.Errorf("cannot share the node's status: %w", err)
		}
	}
	live, err := res[4].AsStrSlice()
	if err != nil {
		return nil, fmt.Errorf("cannot read the nodes' statuses: %w", err)
	}
	reads := make(rueidis.Commands, 0, len(live))
	for _, n := range live {
		if n != node {
			reads = append(reads, c.B().Get().Key(r.statusKey("node."+n)).Build())
		}
	}
	var others [][]byte
	for _, x := range c.DoMulti(ctx, reads...) {
		b, err := x.AsBytes()
		if rueidis.IsRedisNil(err) {
			continue // expired between the range and the read
		}
		if err != nil {
			return nil, fmt.Errorf("cannot read the nodes' statuses: %w", err)
		}
		others = append(others, b)
	}
	return others, nil
}

// Watch marks the cluster as watched for ttl: every node shares its status
// while the mark lasts.
func (r *Redis) Watch(ctx context.Context, ttl time.Duration) error {
	if r.isClosed() {
		return ErrClosed
	}
	c := r.client
	return c.Do(ctx, c.B().Set().Key(r.statusKey("watch")).Value("1").PxMilliseconds(ttl.Milliseconds()).Build()).Error()
}

// Watched tells whether some node's admin page raised the watch mark.
func (r *Redis) Watched(ctx context.Context) (bool, error) {
	if r.isClosed() {
		return false, ErrClosed
	}
	c := r.client
	n, err := c.Do(ctx, c.B().Exists().Key(r.statusKey("watch")).Build()).AsInt64()
	return n > 0, err
}
