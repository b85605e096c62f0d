// Package fanout owns who is in which room on this node and the frames on
// their way to each member.
//
// Each event loop owns one Table: its rooms, their members and the pending
// output of its connections. A Table is touched only by its loop's
// goroutine, so the delivery path takes no lock at all. The Hub is the one
// node-wide piece: it knows which loops hold which room (sharded by room
// hash, taken only on join, leave and per delivered message for a read
// lock of one shard) and keeps the node's broker subscriptions in step.
//
// Frames are immutable once built and shared by reference: a message is
// encoded once and the same bytes sit in every member's pending list until
// the loop writes them. Nothing in this package copies a frame.
package fanout
