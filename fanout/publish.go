package fanout

import (
	"sync"
	"time"

	"github.com/roost-chat/roost/persist"
)

// PubRequest is one publish on its way through the publish path: the Row
// the store commits (and whose Stored it answers), the frame encoded once
// after the commit, and the source that hears the outcome. Every field is
// owned by the request (copied out of the source's read buffer), so the
// pool may hold it across goroutines.
type PubRequest struct {
	persist.Row
	// Frame is the complete server WebSocket frame of the `msg` (header +
	// JSON), encoded once after the commit; nil for a duplicate or an
	// error. Immutable once built: it is shared by every receiver on every
	// loop and may outlive the request.
	Frame []byte
	// Origin is whoever submitted the publish: it hears the outcome.
	Origin Origin
	// Entered is when the publish entered the publish path (monotonic,
	// since an arbitrary epoch of the process), for its commit latency.
	Entered time.Duration
	// The ack's time split, on the same clock (Stamp): when the worker's
	// gatherer took the publish off its queue, when no commit was in
	// flight any more (Taken if none was), when its batch was handed to
	// the committer, when the commit returned, when its batch's broker
	// publish began, and when its source was told (Origin.Published).
	// Node.committed observes the spans between them (AckPhases); the
	// source observes what follows Answered.
	Taken, Idle, Handed, CommitEnd, BrokerAt, Answered time.Duration
	// Tag is the publishing connection's (Table.PubTag; 0: none, the
	// API): the move of its user's read position to this message is
	// announced to the user's other connections, not to it.
	Tag uint64
}

// Stamp is the publish path's clock: monotonic, since an arbitrary epoch
// of the process, the clock of PubRequest's stamps. Any goroutine.
func Stamp() time.Duration { return time.Since(monoEpoch) }

// Origin is the source of a publish (a connection's loop, the server
// API): it is told the outcome of each of its publishes exactly once.
type Origin interface {
	// Published is called from a publish worker once req is stored (and
	// its frame handed to the broker) or has failed (req.Err). It must not
	// block; req belongs to the origin from the call on.
	Published(req *PubRequest)
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
	id, body := r.ID[:0], r.Body[:0]
	if cap(body) > maxPooledBody {
		body = nil
	}
	*r = PubRequest{Row: persist.Row{ID: id, Body: body}}
	requestPool.Put(r)
}
