// Package persist owns where messages live: the Store interface, its memory
// and PostgreSQL implementations, and the publish pool that commits
// publishes in groups and hands each committed message on, pre-encoded,
// in seq order per room.
//
// persist imports only proto; main wires it to the loops and the broker.
package persist

import (
	"context"
	"errors"

	"github.com/roost-chat/roost/proto"
)

// Sentinel errors. Callers map them to protocol err codes.
var (
	// ErrOverloaded: the store cannot take the publish now (queue full,
	// database unreachable, statement timeout). The client gets `err`
	// `overloaded`; nothing was acknowledged, so nothing is lost.
	ErrOverloaded = errors.New("persist: overloaded")
	// ErrClosed: the pool or store was closed.
	ErrClosed = errors.New("persist: closed")
)

// RoomKey is the node-wide name of a room: app + "/" + room. App ids match
// [A-Za-z0-9_.-]{1,64} and room names [A-Za-z0-9_.:-]{1,128}, so "/" never
// occurs in either and the key splits unambiguously (SplitKey).
func RoomKey(app, room string) string { return app + "/" + room }

// SplitKey is the inverse of RoomKey.
func SplitKey(key string) (app, room string) {
	for i := 0; i < len(key); i++ {
		if key[i] == '/' {
			return key[:i], key[i+1:]
		}
	}
	return "", key
}

// PubRequest is one publish on its way to the store. Every field is owned by
// the request (copied out of the connection's read buffer by the loop), so a
// worker may hold it across goroutines. Requests come from and go back to a
// sync.Pool (GetRequest/PutRequest) so the publish path does not allocate one
// per message in steady state.
type PubRequest struct {
	Key  string // RoomKey(app, room)
	From string // user id of the publisher
	ID   []byte // client idempotency key, 1..64 bytes
	Body []byte // the publisher's exact JSON bytes
	// Origin is opaque to persist: the loop's handle of the publishing
	// connection, handed back untouched in Sink.Committed.
	Origin any
}

// PubResult is the outcome of one PubRequest.
type PubResult struct {
	Seq uint64 // room seq: new, or the original one for a duplicate
	TS  int64  // commit time, Unix ms (the original one for a duplicate)
	// Duplicate: (room, from, id) was stored before; nothing new was stored
	// and the message must not be delivered again.
	Duplicate bool
	// Frame is the complete server WebSocket frame of the `msg` (header +
	// JSON), encoded once by the worker; nil for a duplicate or an error.
	// Immutable once built: it is shared by every receiver on every loop.
	Frame []byte
	Err   error // nil, ErrOverloaded, or another error (internal)
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
	CommitBatch(ctx context.Context, reqs []*PubRequest, res []PubResult) error
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
	Committed(req *PubRequest, res *PubResult)
}
