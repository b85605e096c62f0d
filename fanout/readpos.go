package fanout

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"hash/maphash"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/roost-chat/roost/fanout/hist"
	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto"
)

// Read positions: a user's newest read seq in a room. One goroutine owns
// them on a node (positions): it checks a mark against the room's newest
// seq, keeps the larger of the stored position and the mark, answers the
// client, sends the answer to the user's other connections on every node
// (through the broker, on proto.ReadKey) and writes the positions that
// moved to the store coalesced: the latest per user and room, at most once
// a second each, handed to the publish pool so that they are written in
// the transaction of its next group commit (readHandoff); a second with no
// commit writes them on its own within a quarter second (idleFlush).

// ErrReadBeyond refuses a read mark past the room's newest seq.
var ErrReadBeyond = errors.New("seq is beyond the room's newest message")

const (
	posQueue      = 8192        // marks waiting for the positions goroutine
	posFlushEvery = time.Second // the most often a position is written
	// posIdleAfter: how long marks handed to the publish pool wait for a
	// group commit to take them before the positions goroutine writes them
	// itself (a node with no publishes).
	posIdleAfter = 250 * time.Millisecond
	posCacheMax  = 200_000             // cached positions past which clean ones are forgotten
	posEvictTo   = posCacheMax * 3 / 4 // what an eviction leaves: a quarter of the cache at a time
)

type posKey struct{ key, user string }

// posJob is a value in a channel of posQueue slots, whose buffer is made
// whole with the node and, cycled through by every publish's own move,
// stays resident: each byte of it is 8 KiB of every node's heap. The
// rare jobs' fields (unread, the API's reply) are behind ask.
type posJob struct {
	tag      uint64 // own: its connection's (0: none)
	key      string
	user     string
	seq      uint64  // a mark's; a receipts query's: when it was asked (Stamp)
	m        *Member // the client that asked (nil: the API)
	ask      *posAsk // an unread query or the API's mark (nil for most jobs)
	loop     int32
	own      bool // a publish of the user (no answer, no check). With seen: another node's such move
	seen     bool // another node's answer: a floor for this node's view
	receipts bool // a receipts query
	// delivered: a mark at or below the newest seq the marking loop
	// delivered in the room (Table.MarkRead), a stored message however
	// little of the room this goroutine knows. It fills the struct's
	// padding: the slots stay 72 bytes.
	delivered bool
}

// posAsk is what an unread query or an API caller adds to its job.
type posAsk struct {
	rooms []string      // unread: the rooms asked (the job's key is then the app)
	reply chan posReply // the API's answer
	asked time.Duration // unread: when it was asked (Stamp)
}

// rooms and reply read the job's ask.
func (j *posJob) rooms() []string {
	if j.ask == nil {
		return nil
	}
	return j.ask.rooms
}

func (j *posJob) reply() chan posReply {
	if j.ask == nil {
		return nil
	}
	return j.ask.reply
}

type posReply struct {
	seq    uint64
	unread []byte // an unread answer's rooms object
	err    error
}

// positions is the node's read positions, owned by its goroutine.
type positions struct {
	n      *Node
	reads  persist.Reads // nil: the store keeps none, so the node keeps them in memory
	jobs   chan posJob
	pos    map[posKey]uint64 // known positions (a cache over reads)
	floor  floors            // positions other nodes announced, not yet known here (receipts.go)
	dirty  map[posKey]uint64 // moved since the last write
	newest map[string]uint64 // rooms' newest seqs seen
	// looked: the rooms whose newest seq was read from the store for the
	// batch of marks being applied (lookUp); empty between batches.
	looked map[string]bool
	moved  map[string]map[string]uint64 // room key -> user -> position, for the next receipts (receipts.go)
	hand   *readHandoff                 // marks on their way to a group commit
	out    []byte                       // announcements of marks not sent yet (broadcast)
	own    map[posKey]ownMove           // moves by the user's own publishes, announced once a second

	// The marks handed over at the last tick (maybe not written yet), as
	// offered (offer copies them): those due at once, then the rest, each
	// part in (room, user) order, one mark per position. The one record
	// of them: a receipts query finds its room's by binary search
	// (roomState), and the cache's eviction keeps them (evict).
	sentMarks []persist.ReadMark
	sentDue   int

	// The loops' marks and requests come in batches (give), one per
	// wake-up of a loop, and their answers leave in batches (post, then
	// flushAnswers: one PostAll per loop). At 10,000 marks a second, one
	// channel send per mark woke this goroutine's thread, and one Post per
	// answer the loop's, once per mark each: two thread switches and their
	// futex and eventfd calls per mark on a node's one core cost more than
	// the marks themselves.
	inMu    sync.Mutex
	in      []posJob      // given by the loops, not taken yet
	inSpare []posJob      // the batch taken last, reused
	inLen   atomic.Int64  // len(in), for the loops' bound (queuePos)
	wake    chan struct{} // in went from empty to not
	ans     [][]Event     // per loop: answers not posted yet

	// chanBatch: the jobs taken off the channel last (takeJobs), reused.
	chanBatch []posJob

	unreadQ [queryWorkers]chan unreadJob // to the unread workers (reads != nil)

	// Receipts queries at the receipts workers (reads != nil; receipts.go).
	rcptQ    [queryWorkers]chan rcptJob // to the workers
	rcptDone chan rcptJob               // from them: answers to post
	rcptOut  int                        // at the workers or in rcptDone
	rcptWait map[string]*rcptRoom       // by room key: those of the room
	rcptGen  uint64                     // counts the queries handed over
}

func newPositions(n *Node, st persist.Store) *positions {
	p := &positions{n: n, jobs: make(chan posJob, posQueue), pos: map[posKey]uint64{},
		dirty: map[posKey]uint64{}, newest: map[string]uint64{}, looked: map[string]bool{}, moved: map[string]map[string]uint64{},
		own: map[posKey]ownMove{}, wake: make(chan struct{}, 1), ans: make([][]Event, MaxLoops)}
	p.reads, _ = st.(persist.Reads)
	if p.reads != nil {
		p.hand = &readHandoff{reads: p.reads, written: &n.Stats.ReadMarksWritten}
		for i := range p.unreadQ {
			p.unreadQ[i] = make(chan unreadJob, queryQueue)
		}
		for i := range p.rcptQ {
			p.rcptQ[i] = make(chan rcptJob, queryQueue)
		}
		// As many as may be out, so that a worker never waits to give
		// one back.
		p.rcptDone = make(chan rcptJob, queryWorkers*queryQueue)
		p.rcptWait = map[string]*rcptRoom{}
	}
	return p
}

// MarkRead sets user's read position in the room key to at least seq, for
// the client m on loop (its answer comes as a read frame, or an err).
// Loop only; never blocks: with the queue full it answers overloaded.
func (t *Table) MarkRead(m *Member, key, user string, seq uint64) bool {
	n := t.node
	if n == nil {
		return false
	}
	n.tagOf(m)
	// The positions goroutine learns a room's newest seq from this node's
	// publishes and other nodes' read announcements, not from the
	// messages other nodes publish, which reach the loops alone: a mark of
	// one of those would otherwise cost a store read on that goroutine,
	// which every read mark and unread request of the node waits behind.
	r := t.rooms[key]
	delivered := r != nil && r.active && seq <= r.last
	return t.queuePos(posJob{key: key, user: user, seq: seq, m: m, loop: int32(t.idx), delivered: delivered})
}

// SetPositionsSoon makes the table gather the loop's read marks and its
// unread and receipts requests, in order, and hand them to the positions
// goroutine together when the loop calls FlushPositions. soon is called
// on the first one gathered: it must have FlushPositions called at the
// end of the loop's current wake-up (after the rest of the input it
// read). Once, before the loop runs events.
func (t *Table) SetPositionsSoon(soon func()) { t.posSoon = soon }

// queuePos queues a job of this loop for the positions goroutine; false
// when it is posQueue behind. Loop only.
func (t *Table) queuePos(j posJob) bool {
	p := t.node.pos
	if t.posSoon == nil {
		select {
		case p.jobs <- j:
			return true
		default:
			return false
		}
	}
	if len(t.posOut)+int(p.inLen.Load()) >= posQueue {
		return false
	}
	t.posOut = append(t.posOut, j)
	if len(t.posOut) == 1 {
		t.posSoon()
	}
	return true
}

// FlushPositions hands what the loop gathered (SetPositionsSoon) to the
// positions goroutine. Loop only.
func (t *Table) FlushPositions() {
	if len(t.posOut) == 0 || t.node == nil {
		return
	}
	t.node.pos.give(t.posOut)
	clear(t.posOut)
	t.posOut = t.posOut[:0]
}

// give queues a loop's batch, waking the positions goroutine only when
// nothing was waiting. Loop goroutines.
func (p *positions) give(js []posJob) {
	p.inMu.Lock()
	was := len(p.in)
	p.in = append(p.in, js...)
	p.inLen.Store(int64(len(p.in)))
	p.inMu.Unlock()
	if was == 0 {
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
}

// takeIn runs the batches the loops gave, then posts their answers.
func (p *positions) takeIn() {
	p.inMu.Lock()
	js := p.in
	p.in = p.inSpare[:0]
	p.inLen.Store(0)
	p.inMu.Unlock()
	// The jobs queued before this batch was given go first: a publish's
	// move of its own user's position is queued before its ack leaves,
	// so an unread or receipts request the client sends after the ack
	// must see it.
	for k := len(p.jobs); k > 0; {
		n := min(k, posChanBatch)
		p.takeJobs(<-p.jobs, n-1)
		k -= n
	}
	p.runBatch(js)
	clear(js)
	p.inSpare = js[:0]
	p.flushAnswers()
}

// posChanBatch bounds the jobs takeJobs takes off the channel at once
// (72 bytes each, in a slice kept for the next batch).
const posChanBatch = 256

// takeJobs runs first, taken off the jobs channel, and the next more jobs
// queued there (at most posChanBatch in all) as one batch. The Server
// API's marks come through the channel one per request: each needing
// the store (a room this node delivers nothing of, a user's first mark
// here) read it alone, in turn, and every read mark and unread request
// of the node waited behind those reads, as the loops' marks did before
// lookUp and lookUpStored (bench notes, "API marks read together").
// Only this goroutine takes from the channel: the more jobs are there.
func (p *positions) takeJobs(first posJob, more int) {
	js := append(p.chanBatch[:0], first)
	for range min(more, posChanBatch-1) {
		js = append(js, <-p.jobs)
	}
	p.runBatch(js)
	clear(js)
	p.chanBatch = js[:0]
}

// runBatch looks up what the batch's marks need from the store, together,
// then runs its jobs in order.
func (p *positions) runBatch(js []posJob) {
	p.lookUp(js)
	p.lookUpStored(js)
	for i := range js {
		p.do(js[i])
	}
	clear(p.looked)
}

// post queues ev for loop, in order with the loop's other answers.
func (p *positions) post(loop int, ev Event) {
	p.ans[loop] = append(p.ans[loop], ev)
	if len(p.ans[loop]) >= posAnswerBatch {
		p.flushLoop(loop)
	}
}

// posAnswerBatch bounds the answers a loop gets in one PostAll.
const posAnswerBatch = 256

// flushAnswers posts every loop's queued answers, one PostAll each.
func (p *positions) flushAnswers() {
	for i := range p.ans {
		if len(p.ans[i]) > 0 {
			p.flushLoop(i)
		}
	}
}

func (p *positions) flushLoop(i int) {
	p.n.tables[i].Load().loop.PostAll(p.ans[i])
	clear(p.ans[i])
	p.ans[i] = p.ans[i][:0]
}

// MarkRead is the Server API's read mark: it waits for the outcome.
func (n *Node) MarkRead(ctx context.Context, key, user string, seq uint64) (uint64, error) {
	reply := make(chan posReply, 1)
	select {
	case n.pos.jobs <- posJob{key: key, user: user, seq: seq, ask: &posAsk{reply: reply}}:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	select {
	case r := <-reply:
		return r.seq, r.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// PubTag is the tag of m's publishes (PubRequest.Tag), so that the move
// of its user's read position they make is announced to the user's other
// connections only. Loop only.
func (t *Table) PubTag(m *Member) uint64 {
	if t.node == nil {
		return 0
	}
	return t.node.tagOf(m)
}

// ownPublish moves the publisher's position to its new message: one who
// writes has read up to there. Publish workers; never blocks (a full
// queue skips it, counted).
func (n *Node) ownPublish(key, user string, seq, tag uint64) {
	select {
	case n.pos.jobs <- posJob{own: true, key: key, user: user, seq: seq, tag: tag}:
	default:
		n.Stats.ReadMarksDropped.Add(1)
	}
}

func (p *positions) run() {
	defer p.n.wg.Done()
	tick := time.NewTicker(posFlushEvery)
	defer tick.Stop()
	idle := time.NewTimer(time.Hour)
	idle.Stop()
	for {
		select {
		case <-p.n.done:
			// The publish pool has stopped: what it did not take is
			// written here.
			p.handOver()
			p.idleFlush(true)
			return
		case j := <-p.jobs:
			p.takeJobs(j, len(p.jobs))
			if len(p.jobs) == 0 {
				p.flushAnswers()
				p.sendOut()
			}
		case <-p.wake:
			p.takeIn()
			if len(p.jobs) == 0 {
				p.sendOut()
			}
		case r := <-p.rcptDone:
			p.receiptsDone(r)
			if len(p.jobs) == 0 {
				p.flushAnswers()
			}
		case <-tick.C:
			if p.handOver() {
				idle.Reset(posIdleAfter)
			}
			p.receiptsFlush()
			p.announceOwn()
		case <-idle.C:
			p.idleFlush(false)
		}
	}
}

func (p *positions) do(j posJob) {
	k := posKey{j.key, j.user}
	if j.receipts {
		p.receipts(j)
		return
	}
	if j.seen {
		// Another node wrote it (coalesced, maybe not yet): this node's
		// answers must not go below it meanwhile. A move by the user's own
		// publish is no news to the room's receipts.
		if !j.own {
			p.movedTo(j.key, j.user, j.seq)
		}
		p.touched(j.key)
		p.newest[j.key] = max(p.newest[j.key], j.seq)
		if cur, ok := p.pos[k]; ok {
			p.pos[k] = max(cur, j.seq)
		} else {
			p.floor.raise(k, j.seq)
		}
		return
	}
	if j.rooms() != nil {
		p.unread(j)
		return
	}
	if j.own {
		p.newest[j.key] = max(p.newest[j.key], j.seq)
		if j.seq > p.pos[k] {
			// Announced to the user's other connections with the next
			// tick's, coalesced like the write.
			p.own[k] = ownMove{seq: j.seq, tag: j.tag}
		}
		p.move(k, j.seq)
		return
	}
	before := p.pos[k]
	seq, err := p.mark(k, j.seq, j.delivered)
	if r := j.reply(); r != nil {
		r <- posReply{seq: seq, err: err}
	}
	var frame []byte
	if err == nil && seq > before {
		// Moved (as far as this node knew): the user's other connections
		// hear of it; an unmoved position is news to none of them. The
		// announcement's frame is the answer too: encoded once.
		frame = p.broadcast(j.key, j.user, seq, j.m)
	}
	if m := j.m; m != nil {
		p.post(int(j.loop), Event{kind: evReadDone, member: m, key: j.key, seq: seq, err: err, frame: frame})
	}
}

// Unread asks the unread counts of user in rooms of app for the client m
// on this loop (answered with an unread frame). Loop only; false when the
// queue is full.
func (t *Table) Unread(m *Member, app, user string, rooms []string) bool {
	n := t.node
	if n == nil {
		return false
	}
	return t.queuePos(posJob{key: app, user: user, ask: &posAsk{rooms: rooms, asked: Stamp()}, m: m, loop: int32(t.idx)})
}

// Unread is the Server API's unread counts: the rooms object of the
// unread answer.
func (n *Node) Unread(ctx context.Context, app, user string, rooms []string) ([]byte, error) {
	reply := make(chan posReply, 1)
	select {
	case n.pos.jobs <- posJob{key: app, user: user, ask: &posAsk{rooms: rooms, reply: reply, asked: Stamp()}}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case r := <-reply:
		return r.unread, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// unread counts, per room, the messages after the user's position that are
// not edits, deletes or reactions: the store keeps, next to each entry,
// the room's count of messages up to it, so the count is the room's count
// less the one at the position, read with the room's seq and never by
// scanning messages. The position the node holds (a mark not saved yet)
// is the floor of the stored one.
//
// This goroutine takes only what it owns (the floors, the rooms' newest
// seqs) and hands the store's read to an unread worker: with PostgreSQL
// the read takes a millisecond or more, and every mark and receipts query
// of the node waited behind it (100 unread requests a second held this
// goroutine ~15 % of the time; a flood of them would hold it all). The
// answer then leaves apart from the marks' (its own Post), so it may pass
// an earlier answer to the same client; it still counts from every mark
// and own publish the user made before asking. A full worker queue is
// answered overloaded, as a full positions queue is.
func (p *positions) unread(j posJob) {
	rooms := j.rooms()
	n := len(rooms)
	u := unreadJob{j: j, keys: make([]string, n), vals: make([]uint64, 4*n), at: queryStamps{asked: j.ask.asked, taken: Stamp()}}
	_, read, _, newest := u.split()
	for i, r := range rooms {
		k := proto.RoomKey(j.key, r)
		u.keys[i] = k
		pk := posKey{k, j.user}
		read[i] = max(p.pos[pk], p.floor.get(pk))
		newest[i] = p.newest[k]
	}
	if p.reads == nil {
		err := p.countUnread(&u)
		p.answerUnread(u, err, true)
		return
	}
	select {
	case p.unreadQ[queryWorkerOf(j.user)] <- u:
	default:
		p.n.Stats.UnreadRefused.Add(1)
		p.answerUnread(u, proto.ErrOverloaded, true)
	}
}

// queryWorkers do the store reads of unread requests (positions.unread,
// keyed by user) and, as many again, of receipts queries
// (positions.receipts, keyed by room), each with a queue of queryQueue.
// All of a key's queries go to one worker, so that its answers leave in
// the order asked: a client matches a receipts answer to its query by the
// room. Queries of other keys, or the same client's marks, may be
// answered before one asked earlier.
const (
	queryWorkers = 4
	queryQueue   = 64
)

// querySeed picks a key's worker.
var querySeed = maphash.MakeSeed()

func queryWorkerOf(key string) int {
	return int(maphash.String(querySeed, key) % queryWorkers)
}

// unreadJob is an unread request with what the positions goroutine knew
// when it was asked.
type unreadJob struct {
	j    posJob
	keys []string
	vals []uint64 // last, read (the floors), count, newest: len(keys) each
	at   queryStamps
}

// queryStamps are an unread request's or a receipts query's times on its
// way (Stamp), for roost_unread_phase_seconds and
// roost_receipts_phase_seconds: with PostgreSQL's own time for the read
// beside them, they tell where the rest of what a client waits goes.
type queryStamps struct {
	asked   time.Duration // by its loop or the API (0: not known)
	taken   time.Duration // by the positions goroutine
	started time.Duration // its store read (0: none, the query was refused)
	read    time.Duration // the read's end
}

// observe records q's phases up to its answer, posted at posted (the
// loop's inbox is the loop's to record: Table.readDone). A query refused
// before its read records none, so that each phase counts the same
// queries.
func (q *queryStamps) observe(f *hist.Family, posted time.Duration) {
	if q.started == 0 {
		return
	}
	if q.asked != 0 {
		f.Get(phasePositions).Observe((q.taken - q.asked).Seconds())
	}
	f.Get(phaseQueue).Observe((q.started - q.taken).Seconds())
	f.Get(phaseStore).Observe((q.read - q.started).Seconds())
	f.Get(phaseAnswer).Observe((posted - q.read).Seconds())
}

func (u *unreadJob) split() (last, read, count, newest []uint64) {
	n := len(u.keys)
	return u.vals[:n], u.vals[n : 2*n], u.vals[2*n : 3*n], u.vals[3*n:]
}

// unreadWorker runs unread requests' store reads, posting each answer to
// its loop (or the API caller) itself.
func (p *positions) unreadWorker(q chan unreadJob) {
	defer p.n.wg.Done()
	for {
		select {
		case <-p.n.done:
			return
		case u := <-q:
			err := p.countUnread(&u)
			p.answerUnread(u, err, false)
		}
	}
}

// countUnread reads u's rooms from the store, stamping the read's start
// and end. Safe on any goroutine: it touches nothing of positions' own
// state.
func (p *positions) countUnread(u *unreadJob) error {
	u.at.started = Stamp()
	defer func() { u.at.read = Stamp() }()
	last, read, count, _ := u.split()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if p.reads != nil {
		return p.reads.Unread(ctx, u.keys, u.j.user, last, read, count)
	}
	for i, k := range u.keys {
		var err error
		if last[i], err = p.n.store.LastSeq(ctx, k); err != nil {
			return err
		}
		count[i] = last[i] - min(read[i], last[i])
	}
	return nil
}

// answerUnread answers u: to the API caller, or to the client, through
// p.post in order with the other answers when called on the positions
// goroutine (onPos), else through the loop's own Post.
func (p *positions) answerUnread(u unreadJob, err error, onPos bool) {
	j := u.j
	rooms := j.rooms()
	last, read, count, newest := u.split()
	var obj []byte
	if err == nil {
		for i := range u.keys {
			last[i] = max(last[i], newest[i])
			if read[i] >= last[i] {
				read[i], count[i] = last[i], 0
			}
		}
		obj = proto.AppendUnreadObject(nil, rooms, read, last, count)
	}
	if r := j.reply(); r != nil {
		r <- posReply{unread: obj, err: err}
		u.at.observe(p.n.hists.unreadPhases, Stamp())
		return
	}
	ev := Event{kind: evReadDone, flags: doneUnread, member: j.m, key: j.key, err: err}
	if err == nil {
		ev.frame = proto.AppendUnreadFrame(nil, rooms, read, last, count)
	}
	posted := Stamp()
	if u.at.started != 0 {
		ev.cursor = uint64(posted)
	}
	if onPos {
		p.post(int(j.loop), ev)
	} else {
		p.n.tables[j.loop].Load().loop.Post(ev)
	}
	u.at.observe(p.n.hists.unreadPhases, posted)
}

// lookUp reads from the store, in one read, the newest seq of every room
// a mark of the batch js (a loop's, or the jobs channel's: takeJobs)
// names beyond what this goroutine knows of the room (a room whose
// messages other nodes publish, not joined here: Table.MarkRead, or the
// Server API's marks), so that such marks cost one store read a batch rather
// than one each, which the goroutine, and every read mark and unread
// request of the node behind it, would wait for in turn: a client's marks
// beyond a room's newest seq (refused), up to its read rate, would
// otherwise be that many store reads.
func (p *positions) lookUp(js []posJob) {
	var keys []string
	marks := 0
	for i := range js {
		j := &js[i]
		if j.own || j.seen || j.receipts || j.rooms() != nil || j.delivered || j.seq <= p.newest[j.key] {
			continue
		}
		marks++
		if !p.looked[j.key] {
			p.looked[j.key] = true
			keys = append(keys, j.key)
		}
	}
	if len(keys) == 0 {
		return
	}
	last := make([]uint64, len(keys))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	err := p.n.store.LastSeqs(ctx, keys, last)
	cancel()
	p.n.Stats.ReadLookups.Add(1)
	if err != nil {
		clear(p.looked) // each mark asks again (mark), and answers the error
		return
	}
	p.n.Stats.ReadMarksChecked.Add(uint64(marks))
	for i, k := range keys {
		p.newest[k] = max(p.newest[k], last[i])
	}
}

// lookUpStored reads from the store, in one read, the stored position of
// every user and room a mark of the batch js will need it for (the
// user's first mark there since this goroutine last held it, below the
// room's newest seq: a tab that reads back, or a client that marks what
// it shows before the newest arrived), for lookUp's reason: after a
// restart or a reconnect storm, 10,000 users' first marks would be
// 10,000 store reads in turn here, every read mark and unread request of
// the node waiting behind them. A mark the batch's earlier jobs change
// the case of (a publish raising the room's newest) reads alone in mark,
// as does every mark when this read fails.
func (p *positions) lookUpStored(js []posJob) {
	if p.reads == nil {
		return
	}
	var marks []persist.ReadMark
	for i := range js {
		j := &js[i]
		if j.own || j.seen || j.receipts || j.rooms() != nil {
			continue
		}
		k := posKey{j.key, j.user}
		if _, ok := p.pos[k]; ok {
			continue
		}
		if !j.delivered && j.seq > p.newest[j.key] {
			continue // refused (mark)
		}
		if p.atNewest(j.key, j.seq) {
			continue
		}
		// A user marking a room twice in one batch is asked twice: the
		// answers are the same, and stored takes either.
		marks = append(marks, persist.ReadMark{Key: j.key, User: j.user})
	}
	if len(marks) < 2 {
		return // as cheap asked alone (mark)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	err := p.reads.ReadPositionsOf(ctx, marks)
	cancel()
	p.n.Stats.ReadPositionLookups.Add(1)
	if err != nil {
		return // each mark asks again (mark), and answers the error
	}
	for _, m := range marks {
		p.stored(posKey{m.Key, m.User}, m.Seq)
	}
}

// atNewest reports whether seq is the newest seq known of the room key:
// marked up to the room's newest message (what a client showing the room
// does), no stored position can be ahead of it, so the store is not
// asked. 10,000 users' first marks would otherwise be 10,000 reads on
// this goroutine.
func (p *positions) atNewest(key string, seq uint64) bool {
	nw, known := p.newest[key]
	return known && seq > 0 && seq == nw
}

// stored takes k's position as read from the store, raised to any
// other node's announced position this node holds for it.
func (p *positions) stored(k posKey, seq uint64) uint64 {
	fl := p.floor.get(k)
	cur := max(seq, fl)
	p.remember(k, cur)
	if fl <= seq {
		p.floor.take(k) // the store has it
	}
	return cur
}

// mark applies one mark: checked against the room's newest seq, then the
// larger of the position and seq. Most marks ask the store nothing (the
// context, a timer, is made for those that do); a loop's marks beyond
// what this goroutine knows were looked up together (lookUp).
//
// delivered (posJob) skips the check and leaves newest as it is: newest
// must stay a seq read from the store or committed here, since a mark at
// newest skips reading the stored position, and a delivered seq may be
// behind the room's newest (a position stored ahead of it would be
// answered as the mark's).
func (p *positions) mark(k posKey, seq uint64, delivered bool) (uint64, error) {
	if seq > p.newest[k.key] && !delivered {
		if p.looked[k.key] {
			return 0, ErrReadBeyond
		}
		p.n.Stats.ReadMarksChecked.Add(1)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		last, err := p.n.store.LastSeq(ctx, k.key)
		cancel()
		p.n.Stats.ReadLookups.Add(1)
		if err != nil {
			return 0, err
		}
		p.newest[k.key] = max(p.newest[k.key], last)
		if seq > last {
			return 0, ErrReadBeyond
		}
	}
	cur, ok := p.pos[k]
	// Another node's announced position stays in the floor until this
	// node moves past it (dirty then holds it): a receipts query lists
	// the room's users from the store, dirty, sent and the floor, and the
	// other node's write may not have landed yet.
	fl := p.floor.get(k)
	if !ok && p.reads != nil && p.atNewest(k.key, seq) {
		cur, ok = fl, true
	}
	if !ok && p.reads != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		one := []persist.ReadMark{{Key: k.key, User: k.user}}
		err := p.reads.ReadPositionsOf(ctx, one)
		cancel()
		p.n.Stats.ReadPositionLookups.Add(1)
		if err != nil {
			return 0, err
		}
		cur = p.stored(k, one[0].Seq)
	}
	if seq > cur {
		if fl > 0 {
			p.floor.take(k)
		}
		p.move(k, seq)
		p.movedTo(k.key, k.user, seq)
		return seq, nil
	}
	return cur, nil
}

func (p *positions) remember(k posKey, seq uint64) {
	if len(p.pos) >= posCacheMax {
		p.evict()
	}
	p.pos[k] = seq
}

// evict forgets cached positions, never those dirty or handed over at the
// last tick (their writes may not have landed, and the store would answer
// an older position), until posEvictTo are left: a quarter of the cache
// at a time (the map's own random order picks which), so that the
// positions goroutine pauses for a quarter of a full sweep, four times as
// often (BenchmarkPositionsEvict: 35-43 ms a full sweep of 200,000). The
// handed-over ones are put back after a sweep that checks dirty alone: a
// lookup of each cached position among the handed-over marks (binary
// search, string compares) tripled the sweep, 40 -> 125 ms.
func (p *positions) evict() {
	type held struct {
		seq uint64
		ok  bool
	}
	kept := make([]held, len(p.sentMarks))
	for i, m := range p.sentMarks {
		kept[i].seq, kept[i].ok = p.pos[posKey{m.Key, m.User}]
	}
	for c := range p.pos {
		if len(p.pos)+len(kept) <= posEvictTo {
			break
		}
		if _, d := p.dirty[c]; !d {
			delete(p.pos, c)
		}
	}
	for i, m := range p.sentMarks {
		if kept[i].ok {
			p.pos[posKey{m.Key, m.User}] = kept[i].seq
		}
	}
	if len(p.newest) >= posCacheMax {
		clear(p.newest)
	}
}

func (p *positions) move(k posKey, seq uint64) {
	if seq <= p.pos[k] {
		return
	}
	p.remember(k, seq)
	p.touched(k.key)
	if _, ok := p.dirty[k]; ok {
		p.n.Stats.ReadMarksCoalesced.Add(1)
	}
	p.dirty[k] = seq
}

// handOver hands the positions that moved since the last tick to the
// publish pool, whose group commits write them in their transactions over
// the next second (readHandoff.take), and reports whether it did. Marks
// handed at the last tick that no commit took, or that a failed commit
// gave back, go first and at once, with the newer moves of the same
// positions; the rest follows in (room, user) order, so a position that
// keeps moving lands at about the same point of each second and is written
// about a second apart. Without a store that keeps them (persist.Reads)
// the cache is the record and is never forgotten.
func (p *positions) handOver() bool {
	if p.hand == nil {
		clear(p.dirty)
		return false
	}
	left := p.hand.reclaim()
	p.sentMarks, p.sentDue = nil, 0
	if len(left) == 0 && len(p.dirty) == 0 {
		return false
	}
	marks := make([]persist.ReadMark, 0, len(left)+len(p.dirty))
	for _, m := range left {
		k := posKey{m.Key, m.User}
		if seq, ok := p.dirty[k]; ok {
			m.Seq = max(m.Seq, seq)
			delete(p.dirty, k)
		}
		marks = append(marks, m)
	}
	// A position twice among them (taken by a commit that failed after a
	// later offer of it): once, the larger, first after the sort.
	slices.SortFunc(marks, func(a, b persist.ReadMark) int {
		return cmp.Or(compareMarks(a, b), cmp.Compare(b.Seq, a.Seq))
	})
	marks = slices.CompactFunc(marks, func(a, b persist.ReadMark) bool { return compareMarks(a, b) == 0 })
	due := len(marks)
	for k, seq := range p.dirty {
		marks = append(marks, persist.ReadMark{Key: k.key, User: k.user, Seq: seq})
	}
	clear(p.dirty)
	slices.SortFunc(marks[due:], compareMarks)
	p.hand.offer(marks, due, time.Now())
	p.sentMarks, p.sentDue = marks, due
	return true
}

// compareMarks orders marks by room, then user.
func compareMarks(a, b persist.ReadMark) int {
	return cmp.Or(strings.Compare(a.Key, b.Key), strings.Compare(a.User, b.User))
}

// idleFlush writes the marks no group commit took since handOver (no
// publish on this node), in one statement of their own. While commits are
// taking marks, what they did not take yet waits for them (the next tick
// hands it over again with the newer marks), unless all is set.
func (p *positions) idleFlush(all bool) {
	if p.hand == nil || !all && p.hand.tookAny.Load() {
		return
	}
	marks := p.hand.reclaim()
	if len(marks) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	err := p.reads.SaveReads(ctx, marks)
	cancel()
	if err != nil {
		// Dirty again: the next tick hands them over again.
		p.n.Stats.ReadSaveErrors.Add(1)
		p.redirty(marks)
		return
	}
	p.n.Stats.ReadMarksWritten.Add(uint64(len(marks)))
}

// redirty puts marks that were not written back among the moved ones.
func (p *positions) redirty(marks []persist.ReadMark) {
	for _, m := range marks {
		k := posKey{m.Key, m.User}
		p.dirty[k] = max(p.dirty[k], m.Seq)
	}
}

// readHandoff passes coalesced read marks from the positions goroutine to
// the publish pool's committers: once a second the positions goroutine
// offers what moved; the group commits of the next second take them a
// share each and write them in the batch's transaction
// (persist.Reads.CommitReads), or give them back when the commit fails. A
// committer looks at one atomic when nothing is offered.
type readHandoff struct {
	reads   persist.Reads
	written *atomic.Uint64 // Stats.ReadMarksWritten

	offered atomic.Bool // marks or back hold something
	tookAny atomic.Bool // a committer took marks since the last offer
	mu      sync.Mutex
	marks   []persist.ReadMark // offered, not taken
	back    []persist.ReadMark // taken, not written: for the positions goroutine
	// The offer's pace (take): at is when it was made, due how many of its
	// marks were due at once, paced how many follow over readsSpread,
	// taken how many of all were taken since.
	at                time.Time
	due, paced, taken int
}

// offer hands marks over (positions goroutine): the first due at once, the
// rest paced from now.
func (h *readHandoff) offer(marks []persist.ReadMark, due int, now time.Time) {
	h.mu.Lock()
	h.marks = append(h.marks, marks...)
	h.at, h.due, h.paced, h.taken = now, due, len(marks)-due, 0
	h.offered.Store(len(h.marks) > 0 || len(h.back) > 0)
	h.tookAny.Store(false)
	h.mu.Unlock()
}

// readsSpread: the offer's marks are taken evenly over this long, so that
// each commit of the second carries its share (the commits' share of the
// time since the offer) rather than the first ones carrying the whole
// second's: a second's marks of 10,000 users in one statement hold that
// commit, and every publish queued behind it, for tens of ms. It ends
// before the next offer so that the commits of the second take them all.
const readsSpread = posFlushEvery * 9 / 10

// take takes the marks due for a commit now, nil when none (committers).
func (h *readHandoff) take() []persist.ReadMark {
	if h == nil || !h.offered.Load() {
		return nil
	}
	return h.takeAt(time.Now())
}

func (h *readHandoff) takeAt(now time.Time) []persist.ReadMark {
	h.mu.Lock()
	due := h.due + h.paced
	if el := now.Sub(h.at); el < readsSpread {
		due = h.due + int((int64(h.paced)*int64(el)+int64(readsSpread)-1)/int64(readsSpread))
	}
	n := min(len(h.marks), max(0, due-h.taken))
	m := h.marks[:n:n]
	h.marks = h.marks[n:]
	if len(h.marks) == 0 {
		h.marks = nil
	}
	h.taken += n
	h.offered.Store(len(h.marks) > 0 || len(h.back) > 0)
	if n > 0 {
		h.tookAny.Store(true)
	}
	h.mu.Unlock()
	return m
}

// done settles marks a committer took: counted written, or given back to
// be written later.
func (h *readHandoff) done(marks []persist.ReadMark, ok bool) {
	if ok {
		h.written.Add(uint64(len(marks)))
		return
	}
	h.mu.Lock()
	h.back = append(h.back, marks...)
	h.offered.Store(true)
	h.mu.Unlock()
}

// reclaim takes back everything not written: offered and not taken, or
// given back (positions goroutine).
func (h *readHandoff) reclaim() []persist.ReadMark {
	if !h.offered.Load() {
		return nil
	}
	h.mu.Lock()
	m := append(h.marks, h.back...)
	h.marks, h.back = nil, nil
	h.offered.Store(false)
	h.mu.Unlock()
	return m
}

// ownMove is a position moved by the user's own publish, not announced
// yet: the publishing connection's tag (0: the API's) and the seq.
type ownMove struct{ seq, tag uint64 }

// broadcast sends the user's new position to its connections on every
// node but the marking one, through the broker (the signals' queue: at
// most once, like them), and returns its read frame (immutable: the
// announcements' buffer is never written again where it lies).
func (p *positions) broadcast(key, user string, seq uint64, m *Member) []byte {
	tag := signalBit | p.n.sigNode // the API's: no member has serial 0
	if m != nil && m.chat != nil {
		tag = m.chat.sig
	}
	// Gathered while marks keep coming (run sends them once the queue is
	// empty): at 10,000 marks a second, a broker message and a loop event
	// per mark cost the node more than the marks themselves.
	start := len(p.out)
	p.out = appendReadEntry(p.out, key, user, seq, tag, false)
	e := p.out[start:]
	frame := e[13+int(binary.BigEndian.Uint16(e[9:])):]
	if len(p.out) >= readBatchBytes {
		p.sendOut()
	}
	return frame[:len(frame):len(frame)]
}

// sendOut sends the announcements gathered by broadcast.
func (p *positions) sendOut() {
	if len(p.out) > 0 {
		p.send(p.out)
		p.out = nil
	}
}

// announceOwn sends, once a second, the positions that the users' own
// publishes moved to their other connections on every node, many in one
// broker message. Positions goroutine.
func (p *positions) announceOwn() {
	if len(p.own) == 0 {
		return
	}
	var b []byte
	for k, o := range p.own {
		tag := o.tag
		if tag == 0 {
			tag = signalBit | p.n.sigNode
		}
		b = appendReadEntry(b, k.key, k.user, o.seq, tag, true)
		if len(b) >= readBatchBytes {
			p.send(b)
			b = nil
		}
	}
	clear(p.own)
	if len(b) > 0 {
		p.send(b)
	}
}

// readBatchBytes bounds one broker message of announced positions.
const readBatchBytes = 32 << 10

func (p *positions) send(b []byte) {
	select {
	case p.n.signals <- signalJob{key: proto.ReadKey, tag: 0, frame: b}:
	default:
		p.n.Stats.SignalsSkipped.Add(1)
	}
}

// appendReadEntry appends one announced position to a broker message on
// proto.ReadKey, which holds one or more of them: the marker's tag (8
// bytes), 1 when the user's own publish moved it (no news for receipts)
// else 0 (1 byte), the length of "app/user" (2 bytes), "app/user", the
// length of the read frame (2 bytes), the frame.
func appendReadEntry(b []byte, key, user string, seq, tag uint64, own bool) []byte {
	app, room := proto.SplitKey(key)
	b = binary.BigEndian.AppendUint64(b, tag)
	if own {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	b = binary.BigEndian.AppendUint16(b, uint16(len(app)+1+len(user)))
	b = append(append(append(b, app...), '/'), user...)
	at := len(b)
	b = append(b, 0, 0)
	b = proto.AppendReadFrame(b, room, seq)
	binary.BigEndian.PutUint16(b[at:], uint16(len(b)-at-2))
	return b
}

// readEntries calls f with each entry of a broker message on
// proto.ReadKey (see appendReadEntry); a malformed tail is ignored.
func readEntries(b []byte, f func(tag uint64, own bool, userKey, frame []byte)) {
	for len(b) >= 11 {
		tag, own := binary.BigEndian.Uint64(b), b[8] == 1
		ul := int(binary.BigEndian.Uint16(b[9:]))
		if len(b) < 13+ul {
			return
		}
		userKey := b[11 : 11+ul]
		fl := int(binary.BigEndian.Uint16(b[11+ul:]))
		b = b[13+ul:]
		if len(b) < fl {
			return
		}
		f(tag, own, userKey, b[:fl])
		b = b[fl:]
	}
}

// receivedRead hands a broker message of announced positions to every
// loop, which sends each to the user's connections there. Broker
// goroutine.
func (n *Node) receivedRead(b []byte) {
	readEntries(b, func(tag uint64, own bool, userKey, frame []byte) {
		if tag&signalNodeMask == signalBit|n.sigNode {
			return
		}
		// Another node's: a floor for this node's answers.
		payload, _ := proto.ServerFramePayload(frame)
		if room, seq, ok := proto.ReadFrameOf(payload); ok {
			app, user, _ := strings.Cut(string(userKey), "/")
			select {
			case n.pos.jobs <- posJob{seen: true, own: own, key: proto.RoomKey(app, room), user: user, seq: seq}:
			default:
			}
		}
	})
	// Only the loops holding one of the users (one lookup per entry).
	mask := ^uint64(0)
	if f := n.userLoops.Load(); f != nil {
		mask = 0
		readEntries(b, func(_ uint64, _ bool, userKey, _ []byte) { mask |= (*f)(string(userKey)) })
	}
	for i := 0; i < n.cfg.Loops; i++ {
		if mask&(1<<i) == 0 {
			continue
		}
		if t := n.tables[i].Load(); t != nil {
			t.loop.Post(Event{kind: evUserFrame, frame: b})
		}
	}
}

// SetUserLoops gives the node the loops' index of users: f returns the
// set of loop indexes (bit i: loop i) holding a connection of user
// "app/user". A read position from the broker is then posted to those
// loops only, one lookup per position instead of one per loop; without
// it, to every loop. Any goroutine; f is called on the broker's.
func (n *Node) SetUserLoops(f func(userKey string) uint64) { n.userLoops.Store(&f) }

// SetUsers gives the table the loop's index of its users' connections:
// f appends to dst the members of user "app/user" on this loop. A read
// position reaches a user's connections through it (userFrame). The loop
// keeps that index beside its per-user counts (one pointer per
// connection), so an idle connection costs no per-loop map entry, key
// string or chat state for it. Once, before the loop runs events.
func (t *Table) SetUsers(f func(userKey string, dst []*Member) []*Member) { t.usersOf = f }

// userFrames queues each announced position of a broker message (see
// appendReadEntry) for the connections of its user on this loop but the
// one that made it. An SSE connection gets it as "event: read", with no
// id line: it moves no position of the stream.
func (t *Table) userFrames(b []byte) {
	if t.usersOf == nil {
		return
	}
	readEntries(b, func(tag uint64, _ bool, userKey, frame []byte) {
		var event []byte
		t.userBuf = t.usersOf(string(userKey), t.userBuf[:0])
		for _, m := range t.userBuf {
			if tag != 0 && m.chat != nil && m.chat.sig == tag {
				continue
			}
			if m.sse == nil {
				t.enqueue(m, frame)
				continue
			}
			if event == nil {
				event = buildChatEvent(t.arena, "read", frame)
			}
			m.sse.events++
			t.enqueue(m, event)
		}
		clear(t.userBuf)
	})
}

// An evReadDone's flags say which request it answers (none: a read
// mark), so that a failure is told as that request's.
const (
	doneUnread   uint8 = 1 << iota // an unread request (key: the app)
	doneReceipts                   // a receipts query
)

// readDone answers a client's read mark (ev.frame: a moved position's
// frame, encoded once with its announcement), unread request (doneUnread)
// or receipts query (doneReceipts).
func (t *Table) readDone(ev *Event) {
	m := ev.member
	if ev.cursor != 0 && t.node != nil {
		// An unread or receipts answer's wait in this loop's inbox.
		f := t.node.hists.unreadPhases
		if ev.flags&doneReceipts != 0 {
			f = t.node.hists.rcptPhases
		}
		f.Get(phaseInbox).Observe((Stamp() - time.Duration(ev.cursor)).Seconds())
	}
	if m.Out.Closed() {
		return
	}
	t.answer(m)
	if ev.frame != nil {
		t.enqueue(m, ev.frame)
		return
	}
	if ev.flags&doneUnread != 0 {
		t.sendErr(m, nil, proto.CodeOverloaded, "cannot read unread counts now: retry")
		return
	}
	room := roomName(ev.key)
	switch {
	case ev.flags&doneReceipts != 0:
		t.sendErr(m, room, proto.CodeOverloaded, "cannot read the room's receipts now: retry")
	case ev.err == nil:
		a := t.arena
		t.enqueue(m, a.Keep(proto.AppendReadFrame(a.Space(32+len(room)*6), room, ev.seq)))
	case errors.Is(ev.err, ErrReadBeyond):
		t.sendErr(m, room, proto.CodeBadRequest, ev.err.Error())
	default:
		t.sendErr(m, room, proto.CodeOverloaded, "cannot store the read position now: retry")
	}
}
