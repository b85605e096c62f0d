//go:build linux

package uring

import (
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Ring hands a batch of socket operations to the kernel at once. The
// sends are non-blocking (MSG_DONTWAIT: a full socket completes with
// EAGAIN at once rather than waiting in the kernel), issued in the order
// queued, and every batch is complete before Submit returns: the kernel
// touches no buffer of the caller's after that, and an operation it did
// not take is reported as not done (Result), for the caller to do itself.
//
// Where io_uring is not there (an old kernel, a seccomp profile that
// refuses it) New returns nil and the caller makes one syscall an
// operation.
type Ring struct {
	fd      int
	sqHead  *uint32
	sqTail  *uint32
	sqMask  uint32
	sqes    []sqe
	cqHead  *uint32
	cqTail  *uint32
	cqMask  uint32
	cqes    []cqe
	mem     [][]byte // the mappings, for Close
	n       int      // queued, not yet submitted
	res     [Batch]int32
	pending [Batch]bool // queued and not yet completed
	stats   *Stats
	// A SENDMSG's header and iovecs stay here until its batch completes:
	// the kernel reads them during the submit; the frames' memory is the
	// caller's, which it leaves as it is until Submit returns.
	msgs [Batch]unix.Msghdr
	iov  [Iovs]unix.Iovec
	iovN int // iovecs used by the queued batch
}

const (
	sysIOUringSetup       = 425
	sysIOUringEnter       = 426
	opSendmsg             = 9      // IORING_OP_SENDMSG
	opSend                = 26     // IORING_OP_SEND
	opRecv                = 27     // IORING_OP_RECV
	opURingCmd            = 46     // IORING_OP_URING_CMD
	enterGetEvents        = 1      // IORING_ENTER_GETEVENTS
	featNativeWorkers     = 1 << 9 // IORING_FEAT_NATIVE_WORKERS: Linux 5.12 and later
	offSQRing             = 0
	offCQRing             = 0x8000000
	offSQEs               = 0x10000000
	sendFlags         int = unix.MSG_DONTWAIT | unix.MSG_NOSIGNAL
)

type sqOffsets struct {
	head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
	userAddr                                                        uint64
}

type cqOffsets struct {
	head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
	userAddr                                                        uint64
}

type params struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFd uint32
	resv                                                                   [3]uint32
	sq                                                                     sqOffsets
	cq                                                                     cqOffsets
}

// sqe is struct io_uring_sqe as a send, a sendmsg or a recv reads it.
type sqe struct {
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

// cmdSQE is struct io_uring_sqe as a socket command reads it (its unions:
// cmd_op where a send has off, level and optname where it has addr, optlen
// and optval in what sqe leaves as padding).
type cmdSQE struct {
	opcode      uint8
	flags       uint8
	ioprio      uint16
	fd          int32
	cmdOp       uint32
	_           uint32
	level       uint32
	optname     uint32
	len         uint32
	cmdFlags    uint32
	userData    uint64
	bufIndex    uint16
	personality uint16
	optlen      uint32
	optval      uint64
	_           uint64
}

var _ [unsafe.Sizeof(sqe{}) - unsafe.Sizeof(cmdSQE{})]struct{} // same size
var _ [unsafe.Sizeof(cmdSQE{}) - unsafe.Sizeof(sqe{})]struct{}

type cqe struct {
	userData uint64
	res      int32
	flags    uint32
}

// New sets up a ring, or returns nil when the kernel does not offer one.
// Its counts go to stats.
func New(stats *Stats) *Ring {
	var p params
	fd, _, errno := unix.Syscall(sysIOUringSetup, Batch, uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		return nil
	}
	if p.features&featNativeWorkers == 0 {
		// Before Linux 5.12: IORING_OP_SEND may be missing or punt to
		// workers; send(2) it is.
		_ = unix.Close(int(fd))
		return nil
	}
	r := &Ring{fd: int(fd), stats: stats}
	mmap := func(off int64, size uint32) []byte {
		b, err := unix.Mmap(r.fd, off, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
		if err != nil {
			return nil
		}
		r.mem = append(r.mem, b)
		return b
	}
	sq := mmap(offSQRing, p.sq.array+p.sqEntries*4)
	cq := mmap(offCQRing, p.cq.cqes+p.cqEntries*uint32(unsafe.Sizeof(cqe{})))
	sqes := mmap(offSQEs, p.sqEntries*uint32(unsafe.Sizeof(sqe{})))
	if sq == nil || cq == nil || sqes == nil || p.sqEntries < Batch || p.cqEntries < Batch {
		r.Close()
		return nil
	}
	sb, cb := unsafe.Pointer(&sq[0]), unsafe.Pointer(&cq[0])
	r.sqHead = (*uint32)(unsafe.Add(sb, p.sq.head))
	r.sqTail = (*uint32)(unsafe.Add(sb, p.sq.tail))
	r.sqMask = *(*uint32)(unsafe.Add(sb, p.sq.ringMask))
	r.sqes = unsafe.Slice((*sqe)(unsafe.Pointer(&sqes[0])), p.sqEntries)
	r.cqHead = (*uint32)(unsafe.Add(cb, p.cq.head))
	r.cqTail = (*uint32)(unsafe.Add(cb, p.cq.tail))
	r.cqMask = *(*uint32)(unsafe.Add(cb, p.cq.ringMask))
	r.cqes = unsafe.Slice((*cqe)(unsafe.Add(cb, p.cq.cqes)), p.cqEntries)
	// The SQ array maps slot i to SQE i, once: a batch fills the slots in
	// ring order.
	arr := unsafe.Slice((*uint32)(unsafe.Add(sb, p.sq.array)), p.sqEntries)
	for i := range arr {
		arr[i] = uint32(i)
	}
	return r
}

// Close releases the ring. Nothing may be queued.
func (r *Ring) Close() {
	for _, b := range r.mem {
		_ = unix.Munmap(b)
	}
	r.mem = nil
	_ = unix.Close(r.fd)
}

// Len is how many operations are queued for the next Submit; the next one
// queued gets this index.
func (r *Ring) Len() int { return r.n }

// put queues e and returns its index in the batch. The caller made room
// (Full, Fits).
func (r *Ring) put(e sqe) int {
	i := r.n
	e.userData = uint64(i)
	r.sqes[(atomic.LoadUint32(r.sqTail)+uint32(i))&r.sqMask] = e
	r.pending[i] = true
	r.n++
	return i
}

// Send queues a send of frames on the socket fd and returns its index.
// One frame is a plain send; several are a sendmsg over the ring's
// iovecs, whose result is that of a writev (the bytes taken, possibly
// short). The caller checks Fits first and submits when Full; frames[0]
// is not empty, and no frame changes until Submit returns.
func (r *Ring) Send(fd int, frames [][]byte) int {
	e := sqe{
		opcode:   opSend,
		fd:       int32(fd),
		addr:     uint64(uintptr(unsafe.Pointer(&frames[0][0]))),
		len:      uint32(len(frames[0])),
		msgFlags: uint32(sendFlags),
	}
	if len(frames) > 1 {
		at := r.iovN
		for j, f := range frames {
			r.iov[at+j].Base = &f[0]
			r.iov[at+j].SetLen(len(f))
		}
		r.iovN += len(frames)
		h := &r.msgs[r.n]
		*h = unix.Msghdr{Iov: &r.iov[at]}
		h.SetIovlen(len(frames))
		e.opcode = opSendmsg
		e.addr = uint64(uintptr(unsafe.Pointer(h)))
		e.len = 1 // one msghdr, as liburing sets it
	}
	return r.put(e)
}

// Recv queues a non-blocking recv(2) into buf with flags (MSG_PEEK, ...)
// and returns its index; buf stays untouched by the caller until Submit
// returns.
func (r *Ring) Recv(fd int, buf []byte, flags uint32) int {
	return r.put(sqe{
		opcode:   opRecv,
		fd:       int32(fd),
		addr:     uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf)))),
		len:      uint32(len(buf)),
		msgFlags: flags | unix.MSG_DONTWAIT,
	})
}

// SocketCmd queues the socket command op (CmdSetsockopt: setsockopt(fd,
// level, name, *v), Linux 6.7 and later) and returns its index. *v is
// read during the submit. A kernel without the command completes it with
// -EINVAL or -EOPNOTSUPP.
func (r *Ring) SocketCmd(op uint32, fd, level, name int, v *int32) int {
	e := cmdSQE{
		opcode:  opURingCmd,
		fd:      int32(fd),
		cmdOp:   op,
		level:   uint32(level),
		optname: uint32(name),
		optlen:  4,
		optval:  uint64(uintptr(unsafe.Pointer(v))),
	}
	return r.put(*(*sqe)(unsafe.Pointer(&e)))
}

// Fits reports whether a send of k frames has room in the batch; when it
// has not, the caller submits the batch first. A send of more frames than
// a batch's iovecs never fits: writev splits it.
func (r *Ring) Fits(k int) bool { return r.n < Batch && (k == 1 || r.iovN+k <= Iovs) }

// Takes reports whether the ring can carry a send of k frames at all.
func (r *Ring) Takes(k int) bool { return k <= Iovs }

// Full reports whether the batch must be submitted before anything more
// is queued.
func (r *Ring) Full() bool { return r.n == Batch || r.iovN == Iovs }

// Submit hands the queued batch to the kernel and waits for every
// operation of it. It returns how many were queued; Result(i) is
// operation i's outcome.
func (r *Ring) Submit() int {
	n := r.n
	if n == 0 {
		return 0
	}
	r.n = 0
	defer r.unpin()
	atomic.StoreUint32(r.sqTail, atomic.LoadUint32(r.sqTail)+uint32(n))
	r.stats.Submits.Add(1)
	r.stats.Ops.Add(uint64(n))
	_, _, _ = unix.Syscall6(sysIOUringEnter, uintptr(r.fd), uintptr(n), uintptr(n), enterGetEvents, 0, 0)
	// What the kernel took is what its head moved past, whatever the call
	// returned (EINTR before taking any, EBUSY, ...); the rest is
	// withdrawn (the loop is the only producer) and left pending.
	took := n - int(atomic.LoadUint32(r.sqTail)-atomic.LoadUint32(r.sqHead))
	if took < n {
		atomic.StoreUint32(r.sqTail, atomic.LoadUint32(r.sqTail)-uint32(n-took))
		r.stats.Refused.Add(uint64(n - took))
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
			_, _, _ = unix.Syscall6(sysIOUringEnter, uintptr(r.fd), 0, uintptr(took-done), enterGetEvents, 0, 0)
		}
	}
	return n
}

// Result is operation i of the last Submit: done is false when the kernel
// did not take it (the caller does it itself), res otherwise what the
// syscall would have returned (bytes, or -errno).
func (r *Ring) Result(i int) (res int32, done bool) { return r.res[i], !r.pending[i] }

// unpin drops the batch's references to the frames, which the kernel is
// done with once every operation completed: the iovecs would otherwise
// keep frame chunks alive for the GC until the slots are reused.
func (r *Ring) unpin() {
	for j := range r.iov[:r.iovN] {
		r.iov[j].Base = nil
	}
	r.iovN = 0
}
