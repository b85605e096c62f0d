// Package persist owns where messages live: the Store interface, its memory
// and PostgreSQL implementations, and the publish pool that commits
// publishes in groups and hands each committed message on, pre-encoded,
// in seq order per room.
//
// persist imports only proto; main wires it to the loops and the broker.
package persist

import (
	"context"

	"github.com/roost-chat/roost/proto"
)

// Store is where messages live. Implementations: Memory (embedded default)
// and Postgres. Every method may be called from any goroutine.
type Store interface {
	// CommitBatch stores reqs as one unit of work (one transaction for
	// PostgreSQL) and fills res[i] for reqs[i] (Seq, TS, Duplicate, Err; not
	// Frame). Per room, new messages get consecutive seqs in the order of
	// reqs. A request whose (room, from, id) is already stored, or repeats an
	// earlier request of the same batch, gets that message's seq and ts with
	// Duplicate set. When it returns an error, no request of the batch is
	// stored (all-or-nothing) and every res[i].Err is set.
	CommitBatch(ctx context.Context, reqs []*proto.PubRequest, res []proto.PubResult) error
	// LastSeq returns the newest committed seq of a room (0 if none).
	LastSeq(ctx context.Context, key string) (uint64, error)
	// Range returns stored messages with after < seq <= upto in seq order,
	// at most limit of them (the oldest first).
	Range(ctx context.Context, key string, after, upto uint64, limit int) ([]proto.Message, error)
	// History returns the newest stored messages with seq < before (before
	// == 0 means no bound), at most limit, newest last.
	History(ctx context.Context, key string, before uint64, limit int) ([]proto.Message, error)
	// Close releases the store's resources.
	Close()
}

// Sink receives committed publishes from the pool's workers. For each room,
// Committed is called in seq order by one worker goroutine at a time; it
// must not block (hand the frame to the broker and the ack to the loop).
type Sink interface {
	Committed(req *proto.PubRequest, res *proto.PubResult)
}
