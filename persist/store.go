package persist

import (
	"context"

	"github.com/VictoriaMetrics/metrics"

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

// Row is one message as a commit takes it (Key, From, ID, Body: the
// caller's, read during CommitBatch only) and answers it (Stored, filled
// by CommitBatch).
type Row struct {
	Key  string // proto.RoomKey(app, room)
	From string // user id of the publisher
	ID   []byte // client idempotency key, 1 to 64 characters (proto.MaxID)
	Body []byte // the publisher's exact JSON bytes
	// Kind is what the row does; a change (edit, delete, react, unreact)
	// names the message it changes by its seq, Ref. The store checks the
	// rules inside the commit (docs/protocol.md, "Messages that change"):
	// Ref must be a stored, undeleted message of the room (else Err
	// proto.ErrRefNotFound), an edit or delete must come from its sender
	// unless Any (else proto.ErrRefForbidden); a react already standing,
	// or an unreact with nothing to remove, stores nothing and is answered
	// Duplicate with the seq of the entry that stands (the react, the
	// unreact that took it back, or Ref itself when the user never
	// reacted so).
	Kind proto.Kind
	Ref  uint64
	// Any: the publisher may edit or delete any message (the Server API).
	Any bool
	Stored
}

// Stored is what a commit answers for one Row.
type Stored struct {
	Seq uint64 // room seq: new, or the original one for a duplicate
	TS  int64  // commit time, Unix ms (the original one for a duplicate)
	// Duplicate: (room, from, id) was stored before; nothing new was
	// stored and the message must not be delivered again.
	Duplicate bool
	// Err: nil, proto.ErrOverloaded (nothing stored: retry),
	// proto.ErrRoomLimit, proto.ErrClosed, proto.ErrRefNotFound,
	// proto.ErrRefForbidden, or another error (internal).
	// A row with Err set carries no seq.
	Err error
}

// FoldQuery is one page of a folded history: the messages (KindMsg
// entries) with seq < Before (0: no bound), newest last, or, with Forward,
// those with seq > After, oldest first. Limit counts listed messages.
type FoldQuery struct {
	Before, After uint64
	Forward       bool
}

// Folder lists a room's messages as they stand now: each KindMsg entry
// with Folded set, its latest edit's body and time, deleted (body nil),
// and its reactions held by at least one user (sorted by text). Memory and
// Postgres implement it; neither reads more than a bounded number of rows
// per listed message.
type Folder interface {
	Fold(ctx context.Context, key string, q FoldQuery, b Bounds) (msgs []proto.Message, more bool, err error)
}

// Store is where messages live. Implementations: Memory (embedded default)
// and Postgres. Every method may be called from any goroutine.
type Store interface {
	// CommitBatch stores rows as one unit of work (one transaction for
	// PostgreSQL) and fills each row's Stored. Per room, new messages get
	// consecutive seqs in the order of rows. A row whose (room, from, id)
	// is already stored, or repeats an earlier row of the same batch, gets
	// that message's seq and ts with Duplicate set. When it returns an
	// error, no row of the batch is stored (all-or-nothing) and every
	// row's Err is set. The store keeps no reference to a row after the
	// call.
	CommitBatch(ctx context.Context, rows []*Row) error
	// LastSeq returns the newest committed seq of a room (0 if none).
	LastSeq(ctx context.Context, key string) (uint64, error)
	// LastSeqs fills last[i] with LastSeq of keys[i], in one read of the
	// store however many keys there are.
	LastSeqs(ctx context.Context, keys []string, last []uint64) error
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
	// RegisterMetrics adds the store's series (retention, and what each
	// implementation counts of its own) to set, read at scrape time.
	RegisterMetrics(set *metrics.Set)
	// Close releases the store's resources.
	Close()
}
