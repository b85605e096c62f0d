// Package uring is the event loops' io_uring: one ring per loop that
// carries a batch of non-blocking socket operations (send, sendmsg, recv,
// the setsockopt socket command) to the kernel in one io_uring_enter(2)
// and has every one of them completed before Submit returns. It knows
// nothing of connections: an operation is an index into the batch, and
// the caller keeps what it needs per index.
//
// Where a one-frame write is most of what a node does (a chat connection
// gets a frame every few hundred ms; an idle node pings), the kernel's TCP
// send is most of a frame's CPU, and of the rest the largest part is the
// syscall's own entry and exit, which on a machine with page-table
// isolation costs about a microsecond: in a batch it is paid once per
// Batch operations (docs/bench-notes/2026-12-01.md, "One frame per write: the sends in
// batches").
//
// A library was considered. github.com/iceber/iouring-go runs a goroutine
// of its own that reaps completions (woken through an eventfd) and hands
// each result to a channel: a second goroutine per loop, a wake-up per
// batch and a result allocated per request, where the loop completes its
// batch inline and allocates nothing. github.com/pawelgaczynski/giouring
// and github.com/ii64/gouring are ports of liburing's general API; they
// would replace the setup and the two ring buffers (about a hundred lines
// of New and Submit here) with a dependency, for a loop that uses four
// operations and needs each batch complete before it goes on. The
// hand-written ring stays: it is small, its hot path (Send, Submit)
// allocates nothing and makes exactly one syscall per batch, which the
// loop's TestRingBatchesOneFrameWrites and allocation tests hold it to.
//
// A Ring is used by one goroutine (its loop). Stats may be read from any.
package uring

import "sync/atomic"

// Batch is the most operations one Submit carries: as many connections
// as a flush pass writes between two looks at the clock, so a batch never
// holds a pass's slice past its budget.
const Batch = 32

// Iovs bounds the iovecs of one batch: the kernel's IOV_MAX, as many as
// one writev may carry, so a write the ring cannot take (more frames than
// that) is one the writev path splits anyway.
const Iovs = 1024

// CmdSetsockopt is SOCKET_URING_OP_SETSOCKOPT, the cmd_op of SocketCmd.
const CmdSetsockopt = 3

// Stats are a ring's counters; the loops of a node share one.
type Stats struct {
	Submits atomic.Uint64 // io_uring_enter calls that submitted a batch
	Ops     atomic.Uint64 // operations submitted
	// Refused: operations the kernel did not take (the submit failed),
	// which the caller then did itself.
	Refused atomic.Uint64
}
