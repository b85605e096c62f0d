// Package pubsub owns how committed messages travel between nodes: the
// Broker interface, the in-process broker (one node, embedded default) and
// the Redis broker (many nodes). A message crosses it as the pre-encoded
// server frame, encoded once by the publishing node; the broker hands what
// it receives to the one Handler registered with it (fanout's Node). It
// also owns who is in which room over every node: the Presence interface
// and its Redis implementation next to the channels (RedisPresence). A
// node without Redis answers presence from its own counts (fanout's
// localPresence); MemoryPresence, the in-process store, is the model its
// tests and the contract tests hold both against.
//
// pubsub imports only proto; main wires it to fanout.
package pubsub
