package pubsub

import "context"

// Handler receives messages of rooms this node is subscribed to.
type Handler interface {
	// OnMessage is called for each message of a subscribed room. frame is
	// the complete server WebSocket frame of the `msg`, immutable and shared:
	// the handler must neither modify nor retain-and-modify it. OnMessage
	// must not block: it pushes onto the loops' queues and returns.
	// For one room, calls are not concurrent and come in the order the
	// broker received them (which across nodes may not be seq order; the
	// receiver reorders).
	OnMessage(key string, seq uint64, frame []byte)
	// OnReset is called when the broker may have missed messages (a Redis
	// reconnect or failover). The receiver repairs from the store: every
	// subscribed room must be checked for gaps. May be nil-op.
	OnReset()
}

// Publication is one committed message handed to Broker.PublishBatch.
type Publication struct {
	Key   string // persist.RoomKey(app, room)
	Seq   uint64
	Frame []byte // the complete server frame of the msg, immutable
}

// Broker carries committed messages from the publishing node to every node
// with members in the room (key is proto.RoomKey(app, room)).
type Broker interface {
	// Publish hands one committed message to every node subscribed to key,
	// this one included. For one room it is called in seq order by one
	// goroutine at a time.
	Publish(ctx context.Context, key string, seq uint64, frame []byte) error
	// PublishBatch publishes every message of pubs as Publish would, in one
	// round trip to the broker where it has a network (Redis pipelines the
	// batch; a Redis Cluster sends each shard its part at once). errs must
	// be at least as long as pubs: errs[i] is pubs[i]'s outcome, nil or the
	// error Publish would have returned. It returns the number of failures.
	// A room's messages go out in slice order, and as for Publish, one
	// room's calls come from one goroutine at a time. The broker keeps no
	// reference to pubs or errs after the call.
	PublishBatch(ctx context.Context, pubs []Publication, errs []error) int
	// Subscribe starts delivery of key to this node's Handler. It must not
	// block on the network: ready is called (from any goroutine, possibly
	// before Subscribe returns) once the subscription is active, or with an
	// error if it could not be made active. Subscribe and Unsubscribe for
	// one key are called in order; the broker applies them in that order.
	Subscribe(key string, ready func(error))
	// Unsubscribe stops delivery of key. Non-blocking.
	Unsubscribe(key string)
	// Close stops the broker.
	Close() error
}
