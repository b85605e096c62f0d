//go:build linux

package bench

// maxMissingRanges bounds the memory a checker spends remembering holes: a
// run with more holes than this is broken anyway, and the counts stay exact
// for the ranges kept (older ranges are forgotten, so a late arrival into
// one of them counts as a duplicate).
const maxMissingRanges = 64

// SeqChecker verifies one subscriber's view of one room: per the protocol,
// seqs arrive strictly increasing by one from the join point. It reports
// gaps (a seq skipped ahead), duplicates (a seq seen before), and
// reorderings (a skipped seq arriving late, filling a hole). The in-order
// path does not allocate. The zero value takes its baseline from the first
// seq observed; Start sets it from the joined frame instead.
type SeqChecker struct {
	next    uint64
	started bool
	missing []seqRange // holes not yet filled, oldest first

	Received   uint64 // every Observe call
	Gaps       uint64 // times a seq skipped ahead of the expected one
	Missing    uint64 // seqs currently skipped and not (yet) received
	Duplicates uint64 // seqs received again
	Reordered  uint64 // skipped seqs that arrived late
}

type seqRange struct{ lo, hi uint64 } // inclusive

// Start sets the baseline: the room's newest seq at join, so the next
// expected message is joinSeq+1.
func (c *SeqChecker) Start(joinSeq uint64) {
	c.next = joinSeq + 1
	c.started = true
}

// Last is the highest seq received in order (0 if none).
func (c *SeqChecker) Last() uint64 {
	if !c.started || c.next == 0 {
		return 0
	}
	return c.next - 1
}

// Observe records one received seq and reports whether it was new (not a
// duplicate).
func (c *SeqChecker) Observe(seq uint64) bool {
	c.Received++
	if !c.started {
		c.started = true
		c.next = seq + 1
		return true
	}
	switch {
	case seq == c.next:
		c.next++
	case seq > c.next:
		c.Gaps++
		c.Missing += seq - c.next
		c.addMissing(seqRange{c.next, seq - 1})
		c.next = seq + 1
	default:
		if c.fill(seq) {
			c.Reordered++
			c.Missing--
		} else {
			c.Duplicates++
			return false
		}
	}
	return true
}

func (c *SeqChecker) addMissing(r seqRange) {
	if len(c.missing) == maxMissingRanges {
		copy(c.missing, c.missing[1:])
		c.missing = c.missing[:len(c.missing)-1]
	}
	c.missing = append(c.missing, r)
}

// fill removes seq from the holes, reporting whether it was in one.
func (c *SeqChecker) fill(seq uint64) bool {
	for i := range c.missing {
		r := c.missing[i]
		if seq < r.lo || seq > r.hi {
			continue
		}
		switch {
		case r.lo == r.hi:
			c.missing = append(c.missing[:i], c.missing[i+1:]...)
		case seq == r.lo:
			c.missing[i].lo++
		case seq == r.hi:
			c.missing[i].hi--
		default:
			c.missing = append(c.missing, seqRange{})
			copy(c.missing[i+2:], c.missing[i+1:])
			c.missing[i] = seqRange{r.lo, seq - 1}
			c.missing[i+1] = seqRange{seq + 1, r.hi}
		}
		return true
	}
	return false
}

// Clean reports whether everything observed so far was in order.
func (c *SeqChecker) Clean() bool {
	return c.Gaps == 0 && c.Duplicates == 0 && c.Reordered == 0
}
