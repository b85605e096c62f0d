package loop

import (
	"bytes"
	"io"
	"runtime"
	"syscall"
	"testing"

	"github.com/roost-chat/roost/fanout"
	"github.com/roost-chat/roost/loop/internal/uring"
	"github.com/roost-chat/roost/proto"
)

// submits is how many batches the node's rings have submitted.
func submits(l *loopState) uint64 { return l.srv.Stats.Ring.Submits.Load() }

func needRing(t *testing.T, l *loopState) *uring.Ring {
	t.Helper()
	r := l.sendRing()
	if r == nil {
		t.Skip("no io_uring on this kernel: every write is a send(2) of its own")
	}
	return r
}

// bothWays runs f with the loop's one-frame writes going through the ring
// and, as on a kernel without io_uring or with --io-uring=false, without it
// (a send(2) each): the same deliveries must come out of both.
func bothWays(t *testing.T, f func(t *testing.T, ring bool)) {
	for _, ring := range []bool{true, false} {
		name := "send"
		if ring {
			name = "ring"
		}
		t.Run(name, func(t *testing.T) { f(t, ring) })
	}
}

// useRing sets l to write one-frame output through its ring (skipping where
// the kernel has none) or with a send(2) each.
func useRing(t *testing.T, l *loopState, on bool) {
	t.Helper()
	if on {
		needRing(t, l)
		return
	}
	if l.ring != nil {
		l.ring.Close()
	}
	l.ring, l.ringTried = nil, true
}

func readAll(fd int) []byte {
	var out []byte
	buf := make([]byte, 64<<10)
	for {
		n, _ := syscall.Read(fd, buf)
		if n <= 0 {
			return out
		}
		out = append(out, buf[:n]...)
	}
}

// parkedConn finds the member's connection of parkRig by its transport.
func (l *loopState) parkedConn(gc *bufConn) *conn {
	for _, m := range l.q.TakeDirty() {
		if c, ok := m.Owner.(*conn); ok && c.gc == gc {
			return c
		}
	}
	return nil
}

// One message to 100 members of one frame each leaves in ceil(100/32)
// submits of the ring, not 100 syscalls, and every member gets its frame
// whole, counted as one write of one frame each.
func TestRingBatchesOneFrameWrites(t *testing.T) { bothWays(t, batchesOneFrameWrites) }

func batchesOneFrameWrites(t *testing.T, ring bool) { batchedWrites(t, ring, 1) }

// batchedWrites delivers k messages to 100 members at once and checks that
// the ring took them in ceil(100/32) submits, that every member got its k
// frames whole and in order, and that each was one write.
func batchedWrites(t *testing.T, ring bool, k int) *fanoutRig {
	t.Helper()
	rig := newFanoutRig(t, 100, false)
	useRing(t, rig.l, ring)
	for _, p := range rig.peers {
		_ = syscall.SetNonblock(int(p.Fd()), true)
		readAll(int(p.Fd()))
	}
	var before uint64
	if ring {
		before = submits(rig.l)
	}
	rig.deliver(k)
	if got := (100 + uring.Batch - 1) / uring.Batch; ring && submits(rig.l)-before != uint64(got) {
		t.Fatalf("%d submits for 100 writes of %d frames, want %d", submits(rig.l)-before, k, got)
	}
	want := bytes.Repeat(rig.frame, k)
	for i, p := range rig.peers {
		if got := readAll(int(p.Fd())); !bytes.Equal(got, want) {
			t.Fatalf("member %d got %d bytes, want its %d frames (%d)", i, len(got), k, len(want))
		}
	}
	st := &rig.l.srv.Stats
	if w, f := st.Writes.Load(), st.FramesOut.Load(); w != 100 || f != uint64(100*k) {
		t.Fatalf("writes %d, frames %d; want 100 and %d", w, f, 100*k)
	}
	return rig
}

// A consumer whose socket fills while its frames go through the ring gets
// every frame once and in order: what a send did not take goes to gnet and
// the rest waits parked, as with send(2).
func TestRingFullSocketKeepsOrder(t *testing.T) { bothWays(t, fullSocketKeepsOrder) }

func fullSocketKeepsOrder(t *testing.T, ring bool) {
	rig, gc, peer := parkRig(t)
	useRing(t, rig.l, ring)
	var want, got []byte
	parked := false
	body := []byte(`"` + string(bytes.Repeat([]byte("y"), 300)) + `"`)
	for i := 0; i < 300; i++ {
		rig.frame = proto.AppendMsgFrame(nil, "room", uint64(i+1), []byte("m"), "alice", 1764484800123, body)
		want = append(want, rig.frame...)
		rig.deliver(1)
		parked = parked || len(rig.l.parked) > 0
		if i%50 == 49 {
			got = append(got, readAll(peer)...)
			gc.drain()
		}
	}
	for k := 0; k < 1000 && len(got) < len(want); k++ {
		got = append(got, readAll(peer)...)
		gc.drain()
		rig.l.tick()
	}
	got = append(got, readAll(peer)...)
	if !parked {
		t.Fatal("the socket never filled: the test does not reach the short send")
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("peer read %d bytes, want the %d of 300 frames in order", len(got), len(want))
	}
}

// What the ring reports for a send is taken as send(2)'s result: a part
// sent leaves the rest to gnet, a full socket the whole frame, and any
// other error goes to send(2) itself (which closes a broken connection).
func TestRingSendResults(t *testing.T) {
	for _, tc := range []struct {
		name string
		res  func(n int) int32
		want func(f []byte) []byte
	}{
		{"whole", func(n int) int32 { return int32(n) }, func(f []byte) []byte { return nil }},
		{"part", func(int) int32 { return 10 }, func(f []byte) []byte { return f[10:] }},
		{"full socket", func(int) int32 { return -int32(syscall.EAGAIN) }, func(f []byte) []byte { return f }},
		{"other error", func(int) int32 { return -int32(syscall.EINVAL) }, func(f []byte) []byte { return f }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rig, gc, peer := parkRig(t)
			rig.next()
			c := rig.l.parkedConn(gc)
			if c == nil {
				t.Fatal("the member has no pending output")
			}
			st := &rig.l.srv.Stats
			w0 := st.Writes.Load()
			rig.l.sent(c, tc.res(len(rig.frame)))
			if got := readAll(peer); !bytes.Equal(got, tc.want(rig.frame)) {
				t.Fatalf("peer got %d bytes, want %d", len(got), len(tc.want(rig.frame)))
			}
			if c.m.Out.PendingBytes() != 0 || st.Writes.Load() != w0+1 {
				t.Fatalf("pending %d bytes, writes +%d; want 0 and +1", c.m.Out.PendingBytes(), st.Writes.Load()-w0)
			}
		})
	}
}

// A member written at once (flushFresh) that gets output again before the
// tick is in the dirty list twice; its frame goes into the batch once.
func TestRingMemberTwiceInDirtyListSentOnce(t *testing.T) { bothWays(t, memberTwiceSentOnce) }

func memberTwiceSentOnce(t *testing.T, ring bool) {
	rig := newFanoutRig(t, 1, false)
	useRing(t, rig.l, ring)
	p := int(rig.peers[0].Fd())
	_ = syscall.SetNonblock(p, true)
	readAll(p)
	rig.next()
	rig.l.flushFresh()
	rig.next()
	if d := rig.l.q.TakeDirty(); len(d) != 2 || d[0] != d[1] {
		t.Fatalf("dirty list %d long; the test needs the member in it twice", len(d))
	} else {
		rig.l.writeSlice(d, -1)
	}
	if got := readAll(p); !bytes.Equal(got, append(append([]byte{}, rig.frame...), rig.frame...)) {
		t.Fatalf("peer got %d bytes, want two frames (%d)", len(got), 2*len(rig.frame))
	}
	if w := rig.l.srv.Stats.Writes.Load(); w != 2 {
		t.Fatalf("%d writes, want 2", w)
	}
}

// BenchmarkOneFrameWrites is one message to 300 members on loopback TCP
// whose peers read it (each frame its own write, as in a chat load), with
// the ring and with a send(2) per frame, alternating in one run. cpu-ns/frame
// is the loop thread's CPU (user + system) per frame: the TCP send with the
// receiver's side of loopback, and the syscalls around it.
func BenchmarkOneFrameWrites(b *testing.B) { frameWrites(b, 1) }

// BenchmarkTwentyFrameWrites is the same with 20 messages per flush, each
// member's write 20 frames (a room of 300 at ~5,000 msg/s on a 4 ms tick):
// one writev each without the ring ("send"), sendmsg in batches with it.
// Neither allocates.
func BenchmarkTwentyFrameWrites(b *testing.B) { frameWrites(b, 20) }

func frameWrites(b *testing.B, k int) {
	for _, mode := range []string{"send", "ring", "send", "ring"} {
		b.Run(mode, func(b *testing.B) {
			rig := newFanoutRig(b, 0, false)
			var last *conn
			for i := 0; i < 300; i++ {
				sv, cl := tcpPair(b)
				f, _ := sv.File()
				sv.Close()
				fd := int(f.Fd())
				_ = syscall.SetNonblock(fd, true)
				b.Cleanup(func() { f.Close() })
				go func() { _, _ = io.Copy(io.Discard, cl) }()
				c := &conn{gc: &sockConn{fd: fd}, l: rig.l, state: stateOpen}
				c.linkOut()
				if err := rig.l.table.Join(&c.m, []byte(rig.key), fanout.Resume{}); err != nil {
					b.Fatal(err)
				}
				last = c
			}
			rig.pump(b, func() bool { return last.m.Rooms() == 1 })
			rig.l.flush()
			if mode == "send" {
				if rig.l.ring != nil {
					rig.l.ring.Close()
				}
				rig.l.ring, rig.l.ringTried = nil, true
			} else if rig.l.sendRing() == nil {
				b.Skip("no io_uring on this kernel")
			}
			// The members' pending lists grow to k frames once; from
			// then on they come from the table's freelists.
			rig.deliver(k)
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var r0, r1, p0, p1 syscall.Rusage
			b.ReportAllocs()
			b.ResetTimer()
			_ = syscall.Getrusage(syscall.RUSAGE_SELF, &p0)
			_ = syscall.Getrusage(rusageThread, &r0)
			for i := 0; i < b.N; i++ {
				rig.deliver(k)
			}
			_ = syscall.Getrusage(rusageThread, &r1)
			_ = syscall.Getrusage(syscall.RUSAGE_SELF, &p1)
			b.StopTimer()
			cpu := r1.Utime.Nano() + r1.Stime.Nano() - r0.Utime.Nano() - r0.Stime.Nano()
			b.ReportMetric(float64(cpu)/float64(b.N)/300/float64(k), "cpu-ns/frame")
			// The whole process: the peers' reads too, and any kernel
			// worker thread the ring would hand a send to.
			all := p1.Utime.Nano() + p1.Stime.Nano() - p0.Utime.Nano() - p0.Stime.Nano()
			b.ReportMetric(float64(all)/float64(b.N)/300/float64(k), "proc-cpu-ns/frame")
		})
	}
}

const rusageThread = 1 // RUSAGE_THREAD

// --io-uring=false: the loop never sets up a ring, and a one-frame write
// is a send(2) of its own.
func TestRingOff(t *testing.T) {
	rig := newFanoutRig(t, 3, false)
	l := rig.l
	if l.ring != nil {
		l.ring.Close()
	}
	l.ring, l.ringTried = nil, false
	l.srv.cfg.IOURing = false
	rig.deliver(1)
	if l.ring != nil || !l.ringTried {
		t.Fatal("a ring was set up with IOURing off")
	}
	if w := l.srv.Stats.Writes.Load(); w != 3 {
		t.Fatalf("%d writes, want 3", w)
	}
}

// Writes of several frames go through the ring too, as sendmsg in the same
// batches as the one-frame sends: three messages to 100 members are
// ceil(100/32) submits, not 100 writevs, and every member gets its three
// frames in order in one write.
func TestRingBatchesWritesOfSeveralFrames(t *testing.T) { bothWays(t, batchesWritesOfSeveralFrames) }

func batchesWritesOfSeveralFrames(t *testing.T, ring bool) {
	batchedWrites(t, ring, 3)
}

// A batch carries at most uring.Iovs iovecs: 100 frames to each of 30
// members is 3,000 iovecs, so the batches end at 10 members (1,000
// iovecs), not at uring.Batch, and a member with more frames than a batch
// holds is a writev of its own.
func TestRingIovecsBoundABatch(t *testing.T) {
	rig := newFanoutRig(t, 30, true)
	r := needRing(t, rig.l)
	before := submits(rig.l)
	rig.deliver(100)
	per := uring.Iovs / 100
	if got, want := submits(rig.l)-before, uint64((30+per-1)/per); got != want {
		t.Fatalf("%d submits for 30 writes of 100 frames, want %d (%d a batch)", got, want, per)
	}
	st := &rig.l.srv.Stats
	if w, f := st.Writes.Load(), st.FramesOut.Load(); w != 30 || f != 3000 {
		t.Fatalf("writes %d, frames %d; want 30 and 3000", w, f)
	}
	if r.Fits(uring.Iovs+1) || r.Takes(uring.Iovs+1) {
		t.Fatal("a write of more frames than a batch's iovecs fits the ring")
	}
	before = submits(rig.l)
	w0 := st.Writes.Load()
	rig.deliver(uring.Iovs + 1)
	if submits(rig.l) != before {
		t.Fatalf("%d submits for writes of %d frames, want none (writev)", submits(rig.l)-before, uring.Iovs+1)
	}
	if w, f := st.Writes.Load()-w0, st.FramesOut.Load()-3000; w != 30 || f != 30*(uring.Iovs+1) {
		t.Fatalf("writes %d, frames %d; want 30 and %d", w, f, 30*(uring.Iovs+1))
	}
}

// A sendmsg's result is taken as writev's: the frames it took whole are
// done, one it cut leaves its rest to gnet with the frames behind it
// parked, a full socket leaves everything, and any other error goes to
// write itself.
func TestRingSendResultsOfSeveralFrames(t *testing.T) {
	for _, tc := range []struct {
		name string
		res  func(n int) int32
		gnet func(n int) int // bytes that leave after the ring's share: the rest of the cut frame through gnet, or a write of all
		left int             // frames still queued here after
	}{
		{"whole", func(n int) int32 { return int32(3 * n) }, func(n int) int { return 0 }, 0},
		{"two of three", func(n int) int32 { return int32(2 * n) }, func(n int) int { return n }, 0},
		{"into the second", func(n int) int32 { return int32(n + 10) }, func(n int) int { return n - 10 }, 1},
		{"full socket", func(int) int32 { return -int32(syscall.EAGAIN) }, func(n int) int { return n }, 2},
		{"other error", func(int) int32 { return -int32(syscall.EINVAL) }, func(n int) int { return 3 * n }, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rig, gc, peer := parkRig(t)
			rig.next()
			rig.next()
			rig.next()
			c := rig.l.parkedConn(gc)
			if c == nil || len(c.m.Out.Pending()) != 3 {
				t.Fatal("the member has not three frames pending")
			}
			n := len(rig.frame)
			st := &rig.l.srv.Stats
			w0 := st.Writes.Load()
			rig.l.sent(c, tc.res(n))
			// The ring's share is not sent here (the test reports it as
			// taken): the peer reads what gnet or write sent after it.
			if got := len(readAll(peer)); got != tc.gnet(n) {
				t.Fatalf("peer got %d bytes after the ring's share, want %d", got, tc.gnet(n))
			}
			if left := len(c.m.Out.Pending()); left != tc.left {
				t.Fatalf("%d frames still queued, want %d", left, tc.left)
			}
			if st.Writes.Load() != w0+1 {
				t.Fatalf("writes +%d, want +1", st.Writes.Load()-w0)
			}
		})
	}
}
