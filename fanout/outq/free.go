package outq

// pending-list size classes: a connection that gets a frame every few
// hundred ms (a chat: most connections) has one frame per write nearly
// always, and holds 24 bytes of list while it waits rather than 192; most
// other flushes carry a handful of frames; a busy room at 8,000 msg/s and a
// 4 ms tick gives ~32, at 15,000-30,000 msg/s 60-120 and more when a tick
// is stretched; the largest class covers a catch-up burst until flushAt
// forces a write. Above 64 the classes double: a busy Out takes a list
// near its need (3 or 6 KB, not 12).
var classes = [...]int{1, 8, 64, 128, 256, 512, 4096}

// maxFreeBytes bounds each freelist, in bytes of list (24 per frame
// reference), so that a backlog does not pin memory after it has left: a
// burst that took thousands of 4096-frame lists keeps 42 of them, not a
// thousand (96 MB), and all the freelists of a loop keep at most 28 MiB
// of lists, plus 4.6 MiB of the slice headers that hold them (24 bytes a
// list: 174,762 one-frame lists alone take 4 MiB of headers).
// The bound is also what steady high-rate delivery needs: every member of
// a busy room takes its list again at the next tick, and a list dropped at
// a write because its freelist was full is allocated again then (a room
// of 330 at 19,000 msg/s, with 512-frame lists kept to 64, allocated 3 MB
// per tick). Each class up to 512 keeps a list for every member of a room
// of 330 on one loop, up to 512 frames per write (~120,000 msg/s at a 4 ms
// tick, or a node so busy that its ticks stretch), and the small ones keep
// enough for every member of a loop at once (174,762 single-frame lists):
// a commit batch that makes thousands of members dirty in one wake-up
// takes its lists from the freelist, not from the heap.
const maxFreeBytes = 4 << 20

// maxFree is how many lists of each class its freelist keeps.
var maxFree = func() (n [len(classes)]int) {
	for i, size := range classes {
		n[i] = maxFreeBytes / (size * 24)
	}
	return n
}()

func (q *Queue[O]) grow(o *Out[O]) {
	c := cap(o.pending)
	next := -1
	for i, size := range classes {
		if size > c {
			next = i
			break
		}
	}
	var nb [][]byte
	if next < 0 {
		nb = make([][]byte, 0, 2*c) // beyond the largest class: rare, not pooled
	} else {
		nb = q.get(next)
	}
	nb = append(nb, o.pending...)
	q.put(o.pending)
	o.pending = nb
}

func (q *Queue[O]) get(class int) [][]byte {
	fl := q.free[class]
	if n := len(fl); n > 0 {
		b := fl[n-1]
		fl[n-1] = nil
		q.free[class] = fl[:n-1]
		if n-1 < q.unused[class] {
			q.unused[class] = n - 1
		}
		return b
	}
	return make([][]byte, 0, classes[class])
}

// TrimFree gives back half of each freelist's lists that no take reached
// since the last call. maxFreeBytes lets a backlog leave up to 28 MiB of
// lists behind a loop; without a trim they stay for the life of the
// process (a node of 16,700 chat connections kept 8.7 MB of lists after a
// backlog of 1-2 s, as much as the connections' own state). A freelist
// that steady delivery draws from every tick keeps all it uses; a
// backlog's lists are gone within seconds of its end. Call it about once
// a second (the loop's sweep).
func (q *Queue[O]) TrimFree() {
	for i := range q.free {
		fl := q.free[i]
		if drop := (q.unused[i] + 1) / 2; drop > 0 {
			n := len(fl) - drop
			clear(fl[n:])
			fl = fl[:n]
			// The slice holding the lists costs 24 bytes a list itself.
			if cap(fl) > 64 && cap(fl) > 4*len(fl) {
				fl = append(make([][][]byte, 0, 2*len(fl)), fl...)
			}
			q.free[i] = fl
		}
		q.unused[i] = len(q.free[i])
	}
}

func (q *Queue[O]) put(b [][]byte) {
	if cap(b) == 0 {
		return
	}
	// Drop frame references so their chunks can be freed. Only [:len] can
	// hold any: every list is cleared this way when it comes back, so the
	// slots past len are still clear from its last return (clearing the
	// whole capacity cost 3% of the loop at 8,000 msg/s).
	clear(b)
	for i, size := range classes {
		if cap(b) == size {
			if len(q.free[i]) < maxFree[i] {
				q.free[i] = append(q.free[i], b[:0])
			}
			return
		}
	}
}
