package fanout

import (
	"context"
	"slices"

	"github.com/roost-chat/roost/proto"
)

// The server API's reads of presence (docs/protocol.md, Server API
// additions): a room's users, and many rooms' counts at once. They ask the
// pubsub.Presence, as the presence command does, off the publish path.

// PresenceUsers is the number of distinct users with a connection joined
// to the room key on every node, and at most proto.MaxPresenceUsers of
// their names, sorted. Users who joined on this node since the presence
// goroutine's last tick are in it too, as in the presence command's
// answer. Any goroutine; it may wait for Redis.
func (n *Node) PresenceUsers(ctx context.Context, key string) (int, []string, error) {
	count, users, err := n.pres.p.Query(ctx, key, proto.MaxPresenceUsers)
	if err != nil {
		return 0, nil, err
	}
	if local := n.pres.unapplied(key, nil); len(local) > 0 {
		count, users = mergeLocal(count, users, local)
	}
	slices.Sort(users)
	return count, users, nil
}

// PresenceCounts sets counts[i] to the presence count of the room keys[i]
// (as PresenceCount), in one round trip to Redis. Any goroutine.
func (n *Node) PresenceCounts(ctx context.Context, keys []string, counts []int) error {
	return n.pres.p.Counts(ctx, keys, counts)
}
