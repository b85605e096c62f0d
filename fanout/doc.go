// Package fanout owns the publish path: a message from "decoded publish"
// to "frames queued on members".
//
// The Node is the node-wide part. Publish is the one entry for a publish
// from any source (a connection's loop, the server API): a PubRequest
// (the persist.Row to commit, plus the source that hears the outcome, an
// Origin). The publish pool (commit.go) admits it without blocking,
// gathers batches per room shard, commits each through the
// persist.Store, encodes each new message's frame once, and hands the
// batch to the Node (committed), which gives the frames to the broker in
// one round trip (retrying a failed broadcast from the side), shows them
// to the OnCommitted hook (webhooks), and answers each source: an ack
// means "stored and on its way". The broker delivers every message of a
// subscribed room back to the Node (the pubsub.Handler), whose hub knows
// which loops hold the room (sharded by room hash, a read lock of one
// shard per message) and keeps the node's broker subscriptions in step.
//
// Each event loop owns one Table: its rooms, their members and the joins on
// their way. The pending output of its connections is the loop's outbound
// queue (package outq), which the Table fills and the loop drains. The Table keeps
// each room's order (duplicates dropped, messages ahead of a gap held, the
// gap read from the store after GapWindow, the tail read after a broker
// reset) and does a join's catch-up. It is touched only by its loop's
// goroutine, so the delivery path takes no lock at all; work made on other
// goroutines (deliveries, store reads, subscriptions) reaches it as an
// Event posted through the Loop interface, which the loop runs with
// Table.Run. The loop's connections implement Owner.
//
// Frames are immutable once built and shared by reference: a message is
// encoded once and the same bytes sit in every member's pending list until
// the loop writes them. Nothing in this package copies a frame.
//
// fanout imports persist, pubsub and proto; the loops import it.
package fanout
