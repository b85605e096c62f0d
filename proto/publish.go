package proto

import (
	"bytes"
	"errors"
	"sync"
	"time"
)

// The vocabulary of the publish path, shared by every package on it: room
// keys, the publish request and its result, and the errors a store or the
// publish pool answers with.

// Sentinel errors of the publish path. Callers map them to err codes.
var (
	// ErrOverloaded: the publish or read cannot be taken now (queue full,
	// database unreachable, statement timeout). The client gets `err`
	// `overloaded`; nothing was acknowledged, so nothing is lost.
	ErrOverloaded = errors.New("overloaded")
	// ErrClosed: the publish path or the store was closed.
	ErrClosed = errors.New("closed")
)

// RoomKey is the node-wide name of a room: app + "/" + room. App ids match
// [A-Za-z0-9_.-]{1,64} (ValidAppID) and room names [A-Za-z0-9_.:-]{1,128}
// (ValidRoom), so "/" never occurs in either and the key splits
// unambiguously (SplitKey).
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

// ValidAppID reports whether id can name an app: [A-Za-z0-9_.-]{1,64}.
func ValidAppID(id []byte) bool {
	if len(id) == 0 || len(id) > 64 {
		return false
	}
	for _, ch := range id {
		if !(ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' || ch == '_' || ch == '.' || ch == '-') {
			return false
		}
	}
	return true
}

// PubRequest is one publish on its way to the store. Every field is owned by
// the request (copied out of the source's read buffer), so a worker may hold
// it across goroutines.
type PubRequest struct {
	Key  string // RoomKey(app, room)
	From string // user id of the publisher
	ID   []byte // client idempotency key, 1 to 64 characters (MaxID)
	Body []byte // the publisher's exact JSON bytes
	// Origin is whoever submitted the publish: it hears the outcome. Opaque
	// to the store, handed back untouched.
	Origin Origin
	// Entered is when the publish entered the publish path (monotonic,
	// since an arbitrary epoch of the process), for its commit latency.
	Entered time.Duration
}

// Origin is the source of a publish (a connection's loop, the server
// API): it is told the outcome of each of its publishes exactly once.
type Origin interface {
	// Published is called from a publish worker once req is stored (and
	// its frame handed to the broker) or has failed. It must not block;
	// req and res are valid during the call only, except res.Frame, which
	// is immutable and may be kept.
	Published(req *PubRequest, res *PubResult)
}

// PubResult is the outcome of one PubRequest.
type PubResult struct {
	Seq uint64 // room seq: new, or the original one for a duplicate
	TS  int64  // commit time, Unix ms (the original one for a duplicate)
	// Duplicate: (room, from, id) was stored before; nothing new was stored
	// and the message must not be delivered again.
	Duplicate bool
	// Frame is the complete server WebSocket frame of the `msg` (header +
	// JSON), encoded once; nil for a duplicate or an error. Immutable once
	// built: it is shared by every receiver on every loop.
	Frame []byte
	Err   error // nil, ErrOverloaded, or another error (internal)
}

// FrameTS reads the commit time out of a pre-encoded msg frame without
// decoding it. The bytes `,"ts":` cannot occur inside the escaped id or
// from strings before it (a quote in a string is always escaped), so the
// first match is the field.
func FrameTS(frame []byte) (int64, bool) {
	i := bytes.Index(frame, []byte(`,"ts":`))
	if i < 0 {
		return 0, false
	}
	var ts int64
	j := i + len(`,"ts":`)
	for ; j < len(frame) && frame[j] >= '0' && frame[j] <= '9'; j++ {
		ts = ts*10 + int64(frame[j]-'0')
	}
	return ts, j > i+len(`,"ts":`)
}

// requestPool recycles PubRequests with their ID and Body buffers, so the
// publish path does not allocate one per message in steady state.
var requestPool = sync.Pool{New: func() any { return new(PubRequest) }}

// maxPooledBody caps the Body capacity kept by PutPubRequest so one huge
// publish does not pin its buffer in the pool forever.
const maxPooledBody = 64 << 10

// GetPubRequest returns an empty PubRequest, with ID and Body capacity
// from an earlier use when there is one.
func GetPubRequest() *PubRequest { return requestPool.Get().(*PubRequest) }

// PutPubRequest resets r and returns it to the pool. The caller must not
// use r (nor its ID or Body) afterwards; frames never alias them, so a
// frame may outlive the request.
func PutPubRequest(r *PubRequest) {
	r.Key = ""
	r.From = ""
	r.ID = r.ID[:0]
	if cap(r.Body) > maxPooledBody {
		r.Body = nil
	} else {
		r.Body = r.Body[:0]
	}
	r.Origin = nil
	r.Entered = 0
	requestPool.Put(r)
}
