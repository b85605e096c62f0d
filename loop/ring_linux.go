//go:build linux

package loop

import (
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// sendRing hands the loop's writes to the kernel in batches, one
// io_uring_enter(2) for up to ringBatch sockets, instead of one send(2) or
// writev(2) each: a one-frame write is an IORING_OP_SEND, a write of
// several frames an IORING_OP_SENDMSG over an iovec array of the ring's
// (at most ringIovs iovecs a batch: a batch ends early when they are
// spent). When nearly every frame is a write of its own (a chat connection
// gets a frame every few hundred ms, a room of thousands is one frame per
// member per message), the kernel's TCP send is most of a frame's CPU, and
// of the rest the largest part is the syscall's own entry and exit, which
// on a machine with page-table isolation costs about a microsecond: in a
// batch it is paid once per ringBatch frames (docs/benchmarks.md, "One
// frame per write: the sends in batches"). The sends are the same
// non-blocking sends (MSG_DONTWAIT: a full socket completes with EAGAIN at
// once rather than waiting in the kernel), issued in the order queued, and
// every batch is complete before the loop goes on: the frames are not
// touched by the kernel after submit returns, and what a send did not take
// is handled as a short send(2) is.
//
// One ring per loop, used by its goroutine only. Where io_uring is not
// there (an old kernel, a seccomp profile that refuses it) newSendRing
// returns nil and the loop sends one syscall a frame as before.
type sendRing struct {
	fd      int
	sqHead  *uint32
	sqTail  *uint32
	sqMask  uint32
	sqes    []ringSQE
	cqHead  *uint32
	cqTail  *uint32
	cqMask  uint32
	cqes    []ringCQE
	mem     [][]byte // the mappings, for close
	n       int      // queued, not yet submitted
	conns   [ringBatch]*conn
	res     [ringBatch]int32
	pending [ringBatch]bool // queued and not yet completed
	submits uint64          // io_uring_enter calls that submitted a batch (tests)
	// A SENDMSG's header and iovecs stay here until its batch completes:
	// the kernel reads them during the submit, the frames' memory
	// belongs to the members' pending lists, which nothing changes
	// before the batch is through (sendQueued runs before the loop does
	// anything else).
	msgs [ringBatch]unix.Msghdr
	iov  [ringIovs]unix.Iovec
	iovN int // iovecs used by the queued batch
}

// ringIovs bounds the iovecs of one batch: the kernel's IOV_MAX, as many
// as one writev may carry, so a write the ring cannot take (more frames
// than that) is one the writev path splits anyway.
const ringIovs = iovMax

// ringBatch is the most sends one submit carries: as many members as a
// pass looks at between two looks at the clock (passCheck), so a batch
// never holds a slice past its budget.
const ringBatch = passCheck

const (
	sysIOUringSetup       = 425
	sysIOUringEnter       = 426
	ringOpSend            = 26     // IORING_OP_SEND
	ringOpSendmsg         = 9      // IORING_OP_SENDMSG
	ringGetEvents         = 1      // IORING_ENTER_GETEVENTS
	ringFeatNativeWorkers = 1 << 9 // IORING_FEAT_NATIVE_WORKERS: Linux 5.12 and later
	ringOffSQRing         = 0
	ringOffCQRing         = 0x8000000
	ringOffSQEs           = 0x10000000
)

type ringSQOffsets struct {
	head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
	userAddr                                                        uint64
}

type ringCQOffsets struct {
	head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
	userAddr                                                        uint64
}

type ringParams struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFd uint32
	resv                                                                   [3]uint32
	sq                                                                     ringSQOffsets
	cq                                                                     ringCQOffsets
}

type ringSQE struct {
	opcode   uint8
	flags    uint8
	ioprio   uint16
	fd       int32
	off      uint64
	addr     uint64
	len      uint32
	msgFlags uint32
	userData uint64
	pad      [3]uint64
}

type ringCQE struct {
	userData uint64
	res      int32
	flags    uint32
}

// newSendRing sets up a ring, or returns nil when the kernel does not
// offer one.
func newSendRing() *sendRing {
	var p ringParams
	fd, _, errno := unix.Syscall(sysIOUringSetup, ringBatch, uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		return nil
	}
	if p.features&ringFeatNativeWorkers == 0 {
		// Before Linux 5.12: IORING_OP_SEND may be missing or punt to
		// workers; send(2) it is.
		_ = unix.Close(int(fd))
		return nil
	}
	r := &sendRing{fd: int(fd)}
	mmap := func(off int64, size uint32) []byte {
		b, err := unix.Mmap(r.fd, off, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
		if err != nil {
			return nil
		}
		r.mem = append(r.mem, b)
		return b
	}
	sq := mmap(ringOffSQRing, p.sq.array+p.sqEntries*4)
	cq := mmap(ringOffCQRing, p.cq.cqes+p.cqEntries*uint32(unsafe.Sizeof(ringCQE{})))
	sqes := mmap(ringOffSQEs, p.sqEntries*uint32(unsafe.Sizeof(ringSQE{})))
	if sq == nil || cq == nil || sqes == nil || p.sqEntries < ringBatch || p.cqEntries < ringBatch {
		r.close()
		return nil
	}
	sb, cb := unsafe.Pointer(&sq[0]), unsafe.Pointer(&cq[0])
	r.sqHead = (*uint32)(unsafe.Add(sb, p.sq.head))
	r.sqTail = (*uint32)(unsafe.Add(sb, p.sq.tail))
	r.sqMask = *(*uint32)(unsafe.Add(sb, p.sq.ringMask))
	r.sqes = unsafe.Slice((*ringSQE)(unsafe.Pointer(&sqes[0])), p.sqEntries)
	r.cqHead = (*uint32)(unsafe.Add(cb, p.cq.head))
	r.cqTail = (*uint32)(unsafe.Add(cb, p.cq.tail))
	r.cqMask = *(*uint32)(unsafe.Add(cb, p.cq.ringMask))
	r.cqes = unsafe.Slice((*ringCQE)(unsafe.Add(cb, p.cq.cqes)), p.cqEntries)
	// The SQ array maps slot i to SQE i, once: a batch fills the slots in
	// ring order.
	arr := unsafe.Slice((*uint32)(unsafe.Add(sb, p.sq.array)), p.sqEntries)
	for i := range arr {
		arr[i] = uint32(i)
	}
	return r
}

func (r *sendRing) close() {
	for _, b := range r.mem {
		_ = unix.Munmap(b)
	}
	r.mem = nil
	_ = unix.Close(r.fd)
}

// queue adds a send of frames on c's socket; the caller makes room first
// (fits) and submits when the batch is full (full). One frame is a plain
// send; several are a sendmsg over the ring's iovecs, whose result is
// that of a writev (the bytes taken, possibly short).
func (r *sendRing) queue(c *conn, fd int, frames [][]byte) {
	i := r.n
	tail := atomic.LoadUint32(r.sqTail) + uint32(i)
	e := ringSQE{
		opcode:   ringOpSend,
		fd:       int32(fd),
		addr:     uint64(uintptr(unsafe.Pointer(&frames[0][0]))),
		len:      uint32(len(frames[0])),
		msgFlags: unix.MSG_DONTWAIT | unix.MSG_NOSIGNAL,
		userData: uint64(i),
	}
	if len(frames) > 1 {
		at := r.iovN
		for j, f := range frames {
			r.iov[at+j].Base = &f[0]
			r.iov[at+j].SetLen(len(f))
		}
		r.iovN += len(frames)
		h := &r.msgs[i]
		*h = unix.Msghdr{Iov: &r.iov[at]}
		h.SetIovlen(len(frames))
		e.opcode = ringOpSendmsg
		e.addr = uint64(uintptr(unsafe.Pointer(h)))
		e.len = 1 // one msghdr, as liburing sets it
	}
	r.sqes[tail&r.sqMask] = e
	r.conns[i] = c
	r.pending[i] = true
	r.n++
}

// fits reports whether a write of k frames has room in the batch; when it
// has not, the caller submits the batch first. A write of more frames than
// a batch's iovecs never fits: writev splits it.
func (r *sendRing) fits(k int) bool { return k == 1 || r.iovN+k <= ringIovs }

// takes reports whether the ring can carry a write of k frames at all.
func (r *sendRing) takes(k int) bool { return k <= ringIovs }

func (r *sendRing) full() bool { return r.n == ringBatch || r.iovN == ringIovs }

// queued reports whether c has a send in the batch.
func (r *sendRing) queued(c *conn) bool {
	for _, q := range r.conns[:r.n] {
		if q == c {
			return true
		}
	}
	return false
}

// submit sends the queued batch and waits for every send of it. It
// returns how many were queued; res[i] is send i's result (bytes, or
// -errno), and pending[i] stays true for a send the kernel did not take
// (submit failed): the caller sends those itself.
func (r *sendRing) submit() int {
	n := r.n
	if n == 0 {
		return 0
	}
	r.n = 0
	defer r.unpin()
	atomic.StoreUint32(r.sqTail, atomic.LoadUint32(r.sqTail)+uint32(n))
	r.submits++
	_, _, _ = unix.Syscall6(sysIOUringEnter, uintptr(r.fd), uintptr(n), uintptr(n), ringGetEvents, 0, 0)
	// What the kernel took is what its head moved past, whatever the call
	// returned (EINTR before taking any, EBUSY, ...); the rest is
	// withdrawn (the loop is the only producer) and left pending.
	took := n - int(atomic.LoadUint32(r.sqTail)-atomic.LoadUint32(r.sqHead))
	if took < n {
		atomic.StoreUint32(r.sqTail, atomic.LoadUint32(r.sqTail)-uint32(n-took))
	}
	for done := 0; done < took; {
		head, tail := atomic.LoadUint32(r.cqHead), atomic.LoadUint32(r.cqTail)
		for ; head != tail; head++ {
			e := &r.cqes[head&r.cqMask]
			if i := int(e.userData); i < n && r.pending[i] {
				r.res[i] = e.res
				r.pending[i] = false
				done++
			}
		}
		atomic.StoreUint32(r.cqHead, head)
		if done < took {
			_, _, _ = unix.Syscall6(sysIOUringEnter, uintptr(r.fd), 0, uintptr(took-done), ringGetEvents, 0, 0)
		}
	}
	return n
}

// unpin drops the batch's references to the frames, which the kernel is
// done with once every send completed: the iovecs would otherwise keep
// frame chunks alive for the GC until the slots are reused.
func (r *sendRing) unpin() {
	for j := range r.iov[:r.iovN] {
		r.iov[j].Base = nil
	}
	r.iovN = 0
}
