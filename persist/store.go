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

// Head is what a join needs to know of a room before it answers.
type Head struct {
	// Last is the newest committed seq (0: nothing stored yet).
	Last uint64
	// Epoch names the history the room's seqs refer to: an opaque string
	// of at most MaxEpoch bytes. Two reads that see the same epoch see the
	// same numbering; it changes only when that history is gone (a memory
	// store started afresh, a room deleted and made again), so a client
	// holding seqs of an older epoch knows they mean nothing here.
	Epoch string
}

// MaxEpoch bounds an epoch's length.
const MaxEpoch = proto.MaxEpoch

// Bounds limit one read: at most Limit messages and, past the first one,
// at most MaxBytes of MsgSize (0: no byte bound). A read always returns the
// first message it finds, whatever its size, so that a reader paging
// through a room always makes progress.
type Bounds struct {
	Limit    int
	MaxBytes int
}

// msgOverhead approximates the bytes a msg frame adds to a message's id,
// sender and body (field names, seq, ts, room, WebSocket header).
const msgOverhead = 96

// MsgSize is what a message counts against Bounds.MaxBytes: close to the
// size of its msg frame (JSON escapes in the id or sender aside).
func MsgSize(m *proto.Message) int {
	return len(m.Body) + len(m.ID) + len(m.From) + len(m.Room) + msgOverhead
}

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
	// Head returns the room's newest seq and its epoch, creating the room
	// if it does not exist yet: a member that joins a room before its
	// first message must already see the epoch that message will belong
	// to.
	Head(ctx context.Context, key string) (Head, error)
	// Range returns stored messages with after < seq <= upto in seq order
	// (the oldest first) within b. more reports that it stopped at b with
	// messages up to upto left to read. A message that retention removed is
	// simply absent: the caller compares seqs to notice.
	Range(ctx context.Context, key string, after, upto uint64, b Bounds) (msgs []proto.Message, more bool, err error)
	// History returns the newest stored messages with seq < before (before
	// == 0 means no bound) within b, newest last. more reports that it
	// stopped at b with older messages left.
	History(ctx context.Context, key string, before uint64, b Bounds) (msgs []proto.Message, more bool, err error)
	// RetentionStats counts what retention removed.
	RetentionStats() RetentionStats
	// Close releases the store's resources.
	Close()
}

// Sink receives committed publishes from the pool's workers, one answered
// batch per call: res[i] is the outcome of reqs[i]. For each room, batches
// come in seq order from one worker goroutine at a time, so the sink can
// hand a whole batch to the broker in one round trip. Both slices are the
// worker's scratch, valid during the call only; each request belongs to
// the sink from the call on, and a result's Frame is immutable and may be
// kept and shared forever. A result with Err set never carries a seq or a
// frame: nothing was acknowledged as stored. Committed must not block on
// anything but that hand-off (the broker, then the acks to their sources).
type Sink interface {
	Committed(reqs []*proto.PubRequest, res []proto.PubResult)
}
