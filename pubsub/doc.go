// Package pubsub owns how committed messages travel between nodes: the
// Broker interface, the in-process broker (one node, embedded default) and
// the Redis broker (many nodes). A message crosses it as the pre-encoded
// server frame, encoded once by the publishing node; the broker hands what
// it receives to the one Handler registered with it (fanout's Node). It
// also owns who is in which room over every node: the Presence interface,
// in process (MemoryPresence) and in Redis next to the channels
// (RedisPresence).
//
// pubsub imports only proto; main wires it to fanout.
package pubsub
