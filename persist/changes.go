package persist

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/roost-chat/roost/proto"
)

// A batch holding changes (edits, deletes, reactions) is committed in one
// transaction of two round trips, whatever its size: the first locks the
// batch's rooms (in id order, the one order of every commit of every node)
// and reads what the rules need, set-based: the keys stored already, the
// messages the changes name and their state, the users' standing
// reactions (their latest react or unreact entry, by messages_changes);
// the rules are then applied here, row after row in batch
// order (an edit of a message of the same batch, a react then an unreact,
// a change after a delete: each answered as if alone); the second writes
// the new entries, the changed messages' state (one row per message and
// batch however many reactions it got) and the rooms' seqs, and commits.
// A reaction writes its entry alone (messages: the row, its keys and the
// messages_changes entry), as a plain message does, and its message's
// state row once per batch.
// No read of its own per publish, and no row-at-a-time statement.
const (
	// changesLockSQL is a statement of its own: the reads that follow must
	// see what the commits it waited for left (each statement of a READ
	// COMMITTED transaction reads from its own snapshot).
	changesLockSQL = `SELECT id, last_seq, msgs, now() FROM rooms WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE`
	// changesReadSQL: what = 1 a key stored already (a: ord, b: seq), 2 a
	// message named (a: room, b: seq, c: kind, s1: sender, s2: its
	// reaction counts, NULL without a state row, f: deleted), 3 a user's
	// reaction (a: room, b: message, c: entry, s1: sender, s2: reaction, f:
	// active). The standing reaction is found by messages_changes's key,
	// whose third column is a hash of sender and reaction (migration 0016):
	// the hash must be spelt as the index spells it for the planner to
	// descend it, and the texts are compared on the row because two pairs
	// may share a hash.
	changesReadSQL = `
SELECT 1 AS what, i.ord::int8 AS a, m.seq AS b, 0::int8 AS c, m.ts, NULL::text AS s1, NULL::text AS s2, false AS f
FROM unnest($1::int8[], $2::text[], $3::bytea[], $4::int4[]) AS i (room_id, sender, idem_key, ord)
JOIN messages m ON m.room_id = i.room_id AND m.sender = i.sender AND m.idem_key = i.idem_key
UNION ALL
SELECT 2, m.room_id, m.seq, m.kind, m.ts, m.sender, st.reactions::text, coalesce(st.deleted, false)
FROM unnest($5::int8[], $6::int8[]) AS r (room_id, seq)
JOIN messages m ON m.room_id = r.room_id AND m.seq = r.seq
LEFT JOIN message_state st ON st.room_id = m.room_id AND st.seq = m.seq
UNION ALL
SELECT 3, k.room_id, k.seq, x.seq, x.ts, k.sender, k.reaction, x.kind = 3
FROM unnest($7::int8[], $8::int8[], $9::text[], $10::text[]) AS k (room_id, seq, sender, reaction)
CROSS JOIN LATERAL (
	SELECT m.seq, m.ts, m.kind FROM messages m
	WHERE m.room_id = k.room_id AND m.ref = k.seq AND m.ref IS NOT NULL AND hashtextextended(m.sender, hashtextextended(m.reaction, 0)) = hashtextextended(k.sender, hashtextextended(k.reaction, 0))
		AND m.sender = k.sender AND m.reaction = k.reaction
	ORDER BY m.seq DESC LIMIT 1
) x`

	// changesGuardSQL locks the batch's rooms as changesLockSQL does and
	// fails (division by zero) unless every room ($1, in id order) has
	// the last_seq the node knows ($2) and keeps every message the batch
	// names in it: kept_from (migration 0014), which every removal of
	// entries raises past what it removed, at or below the lowest message
	// named ($3; the int8 maximum when none is). What a batch committed
	// from the node's knowledge rests on, on the rooms' rows alone: the
	// messages are not read (their lookup was ~2-3 µs of PostgreSQL CPU
	// per reaction, bench notes "react27"). It answers the transaction's
	// now(), the time of the entries. A room's row is checked as the lock
	// finds it, after the commits the lock waited for (a row whose
	// last_seq or kept_from they changed is not locked, and the statement
	// fails).
	changesGuardSQL = `
SELECT 1 / ((SELECT count(*) FROM (
		SELECT r.id FROM rooms r JOIN unnest($1::int8[], $2::int8[], $3::int8[]) AS g (id, last, low) ON r.id = g.id
		WHERE r.last_seq = g.last AND r.kept_from <= g.low ORDER BY r.id FOR NO KEY UPDATE OF r) l) = coalesce(cardinality($1::int8[]), 0))::int, now()`

	// changesKeysSQL: changesReadSQL's keys stored already, alone.
	changesKeysSQL = `
SELECT i.ord::int8, m.seq, m.ts
FROM unnest($1::int8[], $2::text[], $3::bytea[], $4::int4[]) AS i (room_id, sender, idem_key, ord)
JOIN messages m ON m.room_id = i.room_id AND m.sender = i.sender AND m.idem_key = i.idem_key`

	// changesWriteSQL writes a batch's entries, the state of the messages
	// it changed (one row per message: its latest edit, deleted, its
	// reaction counts as they stand after the batch) and the rooms' seqs,
	// in one statement. The counts are merged here, not in PostgreSQL: the
	// rules start from each message's counts as stored (read under the
	// rooms' locks, or known to the node and checked by the guard's
	// last_seq, which every write to a room moves), so the whole value is
	// written as is. A merge in the upsert (jsonb_each_text of both, a
	// sum grouped by reaction, jsonb_object_agg) cost PostgreSQL 1-6 µs
	// per reaction in the store benchmark (bench notes, "react").
	// $21 is each room's first change in the batch (0: none): the room's
	// listed_from when it had none before (migration 0013).
	// $20 is the entries' time: the transaction's now() as the lock read
	// it, or NULL for now() when the batch is committed from what the
	// node knows (runChanges: the guard reads it, and the answers are
	// given it after the commit).
	changesWriteSQL = `
WITH ins AS (
	INSERT INTO messages (room_id, seq, sender, idem_key, ts, body, batch, kind, ref, msgs, reaction)
	SELECT i.room_id, i.seq, i.sender, i.idem_key, coalesce($20::timestamptz, now()), i.body, $9, i.kind, nullif(i.ref, 0), i.msgs, nullif(i.reaction, '')
	FROM unnest($1::int8[], $2::int8[], $3::text[], $4::bytea[], $5::bytea[], $6::int2[], $7::int8[], $8::int8[], $16::text[])
		AS i (room_id, seq, sender, idem_key, body, kind, ref, msgs, reaction)
), state AS (
	INSERT INTO message_state AS st (room_id, seq, edited, body, deleted, reactions)
	SELECT s.room_id, s.seq, CASE WHEN s.edited THEN coalesce($20::timestamptz, now()) END, s.body, s.deleted, s.reactions::jsonb
	FROM unnest($10::int8[], $11::int8[], $12::bool[], $13::bytea[], $14::bool[], $15::text[]) AS s (room_id, seq, edited, body, deleted, reactions)
	ON CONFLICT (room_id, seq) DO UPDATE SET
		edited = coalesce(EXCLUDED.edited, st.edited),
		body = CASE WHEN EXCLUDED.deleted THEN NULL WHEN EXCLUDED.edited IS NOT NULL THEN EXCLUDED.body ELSE st.body END,
		deleted = st.deleted OR EXCLUDED.deleted,
		reactions = EXCLUDED.reactions
)
UPDATE rooms r SET last_seq = u.l, msgs = u.c, listed_from = coalesce(r.listed_from, nullif(u.f, 0))
FROM unnest($17::int8[], $18::int8[], $19::int8[], $21::int8[]) AS u (id, l, c, f)
WHERE r.id = u.id AND r.last_seq <> u.l`
)

type refKey struct{ room, seq int64 }

type refState struct {
	kind    int16
	sender  string
	ts      time.Time
	deleted bool
	// counts are the message's reactions held (none at 0; nil: none), as
	// stored; the rules of a batch add its reactions to them.
	counts map[string]int
}

type reactKey struct {
	room, seq    int64
	sender, text string
}

type reactState struct {
	entry  int64
	ts     time.Time
	active bool
}

type roomSeqs struct{ last, msgs int64 }

// runChanges commits s's distinct publishes (a batch holding changes) on
// conn and fills their rows' Stored.
//
// With lookup false (changesFreshSQL), the batch's keys are taken as new,
// as freshSQL takes a batch of messages: the read does not look them up,
// a stored key among the rows written fails the write with a unique
// violation (the batch is then sent again with lookup), and the rows the
// rules refuse or answer with a standing reaction, which write nothing,
// are looked up in the second round trip, before the write, and answered
// as stored if they are.
//
// With lookup false and every room, message named and standing reaction
// of the batch known to the node (kindsCache), the batch is committed in
// one round trip and one implicit transaction, as a plain batch is: the
// lock and a guard that fails the transaction unless each room's last_seq
// is what the node knows and no message named was removed since (its
// kept_from), then the writes; a failed guard drops the node's knowledge
// of the batch's rooms and the batch is committed the long way.
func (p *Postgres) runChanges(ctx context.Context, conn *pgxpool.Conn, s *pgScratch, rs []*Row, token int64, lookup bool) error {
	if !lookup {
		if k := p.kc.known(s); k != nil {
			err := p.runChangesKnown(ctx, conn, s, rs, token, k)
			if !errors.Is(err, errStale) {
				return err
			}
			p.staleCommits.Add(1)
		}
	}
	// The reads: the keys, the messages named (distinct), the reactions.
	var refRooms, refSeqs []int64
	seenRef := map[refKey]bool{}
	var kRooms, kSeqs []int64
	var kSenders, kTexts []string
	for j := range s.uOrd {
		if s.uKind[j] == int16(proto.KindMsg) {
			continue
		}
		rk := refKey{s.uRoom[j], s.uRef[j]}
		if !seenRef[rk] {
			seenRef[rk] = true
			refRooms, refSeqs = append(refRooms, rk.room), append(refSeqs, rk.seq)
		}
		if proto.Kind(s.uKind[j]).IsReaction() {
			kRooms, kSeqs = append(kRooms, rk.room), append(kSeqs, rk.seq)
			kSenders, kTexts = append(kSenders, s.uSender[j]), append(kTexts, s.uText[j])
		}
	}
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(changesLockSQL, s.rooms)
	if lookup {
		b.Queue(changesReadSQL, s.uRoom, s.uSender, s.uKey, s.uOrd, refRooms, refSeqs, kRooms, kSeqs, kSenders, kTexts)
	} else {
		b.Queue(changesReadSQL, []int64(nil), []string(nil), [][]byte(nil), []int32(nil), refRooms, refSeqs, kRooms, kSeqs, kSenders, kTexts)
	}
	br := conn.SendBatch(ctx, b)
	rooms := make(map[int64]*roomSeqs, len(s.rooms))
	dups := make(map[int32]Stored)
	refs := make(map[refKey]*refState, len(refRooms))
	reacts := make(map[reactKey]reactState, len(kRooms))
	var now time.Time
	err := func() error {
		if _, err := br.Exec(); err != nil { // BEGIN
			return err
		}
		rows, _ := br.Query()
		for rows.Next() {
			var id, last, msgs int64
			if err := rows.Scan(&id, &last, &msgs, &now); err != nil {
				return err
			}
			rooms[id] = &roomSeqs{last, msgs}
		}
		if err := rows.Err(); err != nil {
			return err
		}
		rows, _ = br.Query()
		for rows.Next() {
			var what int32
			var a, b, c int64
			var ts time.Time
			var s1, s2 *string
			var f bool
			if err := rows.Scan(&what, &a, &b, &c, &ts, &s1, &s2, &f); err != nil {
				return err
			}
			switch what {
			case 1:
				dups[int32(a)] = Stored{Seq: uint64(b), TS: ts.UnixMilli(), Duplicate: true}
			case 2:
				ref := &refState{kind: int16(c), sender: *s1, ts: ts, deleted: f}
				if s2 != nil && len(*s2) > 2 {
					if err := json.Unmarshal([]byte(*s2), &ref.counts); err != nil {
						return err
					}
				}
				refs[refKey{a, b}] = ref
			case 3:
				reacts[reactKey{a, b, *s1, *s2}] = reactState{entry: c, ts: ts, active: f}
			}
		}
		return rows.Err()
	}()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	// What the reads found not to exist: no standing reaction.
	for j := range kRooms {
		k := reactKey{kRooms[j], kSeqs[j], kSenders[j], kTexts[j]}
		if ref := refs[refKey{k.room, k.seq}]; ref != nil {
			if _, ok := reacts[k]; !ok {
				reacts[k] = reactState{entry: k.seq, ts: ref.ts}
			}
		}
	}
	k := &knownBatch{rooms: rooms, refs: refs, reacts: reacts}
	return p.writeChanges(ctx, conn, s, rs, token, lookup, dups, k, now, nil)
}

// knownBatch is what a batch's rules start from: its rooms' seqs, the
// messages it names, its users' standing reactions (a reaction with none
// standing: entry is the message, active false).
type knownBatch struct {
	rooms  map[int64]*roomSeqs
	refs   map[refKey]*refState
	reacts map[reactKey]reactState
}

// runChangesKnown commits a batch from what the node knows, in one round
// trip (see runChanges). errStale: the node's knowledge was out of date,
// nothing was stored.
//
// No BEGIN or COMMIT: the statements of one pipeline (pgx sends a batch
// with one Sync) are one implicit transaction, which PostgreSQL commits at
// the Sync, or rolls back whole when a statement fails; each statement
// still reads from its own snapshot (READ COMMITTED), so the writes see
// what the commits the guard's lock waited for left. Two statements fewer
// per batch: PostgreSQL CPU a reaction costs and a plain publish does not.
func (p *Postgres) runChangesKnown(ctx context.Context, conn *pgxpool.Conn, s *pgScratch, rs []*Row, token int64, k *knownBatch) error {
	low := make(map[int64]int64, len(s.rooms))
	for rk := range k.refs {
		if l, ok := low[rk.room]; !ok || rk.seq < l {
			low[rk.room] = rk.seq
		}
	}
	gLast, gLow := make([]int64, len(s.rooms)), make([]int64, len(s.rooms))
	for i, id := range s.rooms { // in id order
		gLast[i], gLow[i] = k.rooms[id].last, math.MaxInt64
		if l, ok := low[id]; ok {
			gLow[i] = l
		}
	}
	pre := &pgx.Batch{}
	pre.Queue(changesGuardSQL, s.rooms, gLast, gLow)
	return p.writeChanges(ctx, conn, s, rs, token, false, map[int32]Stored{}, k, unknownNow, pre)
}

// unknownNow stands for the transaction's now() in the rules of a batch
// committed from what the node knows, until the guard has read it.
var unknownNow = time.UnixMilli(-1)

// errStale: a batch committed from what the node knew met a room or a
// message that changed elsewhere; nothing was stored.
var errStale = errors.New("the node's knowledge of a room is out of date")

// writeChanges applies the rules to a batch from k and sends the writes
// and COMMIT, or, when pre is not nil (runChangesKnown), pre's statements,
// the guard last, then the writes, in one implicit transaction.
func (p *Postgres) writeChanges(ctx context.Context, conn *pgxpool.Conn, s *pgScratch, rs []*Row, token int64, lookup bool,
	dups map[int32]Stored, k *knownBatch, now time.Time, pre *pgx.Batch) error {
	rooms, refs, reacts := k.rooms, k.refs, k.reacts
	base := make(map[int64]roomSeqs, len(rooms))
	for id, r := range rooms {
		base[id] = *r
	}
	created := map[refKey]bool{}
	firstChange := map[int64]int64{}

	// The rules, in batch order.
	var w changeWrites
	states := map[refKey]*stateWrite{}
	state := func(k refKey) *stateWrite {
		st := states[k]
		if st == nil {
			st = &stateWrite{}
			states[k] = st
		}
		return st
	}
	nowMS := now.UnixMilli()
	var unwritten []int // with lookup false: the rows that write nothing
	for j, ord := range s.uOrd {
		r := rs[ord]
		if d, ok := dups[int32(ord)]; ok {
			r.Stored = d
			continue
		}
		room := rooms[s.uRoom[j]]
		if room == nil {
			return fmt.Errorf("cannot commit batch: BUG: room %d not locked", s.uRoom[j])
		}
		kind := proto.Kind(s.uKind[j])
		rk := refKey{s.uRoom[j], s.uRef[j]}
		var text string
		if kind != proto.KindMsg {
			ref := refs[rk]
			if ref == nil || ref.kind != int16(proto.KindMsg) || ref.deleted {
				r.Stored = Stored{Err: proto.ErrRefNotFound}
				unwritten = append(unwritten, j)
				continue
			}
			if (kind == proto.KindEdit || kind == proto.KindDelete) && !s.uAny[j] && ref.sender != s.uSender[j] {
				r.Stored = Stored{Err: proto.ErrRefForbidden}
				unwritten = append(unwritten, j)
				continue
			}
			if kind.IsReaction() {
				text = s.uText[j]
				k := reactKey{rk.room, rk.seq, s.uSender[j], text}
				cur, ok := reacts[k]
				if !ok {
					cur = reactState{entry: rk.seq, ts: ref.ts}
				}
				if cur.active == (kind == proto.KindReact) {
					r.Stored = Stored{Seq: uint64(cur.entry), TS: cur.ts.UnixMilli(), Duplicate: true}
					unwritten = append(unwritten, j)
					continue
				}
			}
		}
		room.last++
		if kind == proto.KindMsg {
			room.msgs++
			// A change later in the batch may name it.
			refs[refKey{s.uRoom[j], room.last}] = &refState{kind: int16(proto.KindMsg), sender: s.uSender[j], ts: now}
			created[refKey{s.uRoom[j], room.last}] = true
		}
		seq := room.last
		if _, ok := firstChange[s.uRoom[j]]; !ok && kind != proto.KindMsg {
			firstChange[s.uRoom[j]] = seq
		}
		w.add(s, j, seq, room.msgs, text)
		r.Stored = Stored{Seq: uint64(seq), TS: nowMS}
		switch kind {
		case proto.KindEdit:
			st := state(rk)
			st.edited, st.body = true, s.uBody[j]
		case proto.KindDelete:
			refs[rk].deleted = true
			state(rk).deleted = true
		case proto.KindReact, proto.KindUnreact:
			on := kind == proto.KindReact
			k := reactKey{rk.room, rk.seq, s.uSender[j], text}
			reacts[k] = reactState{entry: seq, ts: now, active: on}
			state(rk)
			ref := refs[rk]
			if ref.counts == nil {
				ref.counts = map[string]int{}
			}
			if on {
				ref.counts[text]++
			} else if ref.counts[text]--; ref.counts[text] <= 0 {
				delete(ref.counts, text)
			}
		}
	}
	for k, st := range states {
		body := st.body
		if st.deleted {
			body = nil
		}
		js := []byte("{}")
		if c := refs[k].counts; len(c) > 0 {
			var err error
			if js, err = json.Marshal(c); err != nil {
				return err
			}
		}
		w.sRoom, w.sSeq, w.sEdited, w.sBody, w.sDeleted, w.sReactions = append(w.sRoom, k.room), append(w.sSeq, k.seq),
			append(w.sEdited, st.edited), append(w.sBody, body), append(w.sDeleted, st.deleted), append(w.sReactions, string(js))
	}
	var rIDs, rLast, rMsgs, rFirst []int64
	for id, r := range rooms {
		rIDs, rLast, rMsgs, rFirst = append(rIDs, id), append(rLast, r.last), append(rMsgs, r.msgs), append(rFirst, firstChange[id])
	}

	// The writes and the commit, in one round trip.
	b := pre
	if b == nil {
		b = &pgx.Batch{}
	}
	nPre := b.Len()
	var uRoom []int64
	var uSender []string
	var uKey [][]byte
	var uOrd []int32
	if !lookup {
		for _, j := range unwritten {
			uRoom, uSender, uKey, uOrd = append(uRoom, s.uRoom[j]), append(uSender, s.uSender[j]), append(uKey, s.uKey[j]), append(uOrd, s.uOrd[j])
		}
	}
	if len(uOrd) > 0 {
		b.Queue(changesKeysSQL, uRoom, uSender, uKey, uOrd)
	}
	b.Queue(changesWriteSQL, w.room, w.seq, w.sender, w.key, w.body, w.kind, w.ref, w.msgs, token,
		w.sRoom, w.sSeq, w.sEdited, w.sBody, w.sDeleted, w.sReactions,
		w.text,
		rIDs, rLast, rMsgs, nowArg(now), rFirst)
	if len(s.rRoom) > 0 {
		b.Queue(saveReadsSQL, s.rRoom, s.rUser, s.rSeq) // the group commit's read marks (CommitReads)
	}
	if pre == nil {
		b.Queue("COMMIT")
	}
	br := conn.SendBatch(ctx, b)
	var err error
	dbNow := now
	for i := range nPre {
		if i == nPre-1 { // the guard
			var one int32
			if err = br.QueryRow().Scan(&one, &dbNow); err != nil {
				break
			}
		} else if _, err = br.Exec(); err != nil {
			break
		}
	}
	if err == nil && len(uOrd) > 0 {
		err = func() error {
			rows, _ := br.Query()
			for rows.Next() {
				var ord, seq int64
				var ts time.Time
				if err := rows.Scan(&ord, &seq, &ts); err != nil {
					return err
				}
				rs[ord].Stored = Stored{Seq: uint64(seq), TS: ts.UnixMilli(), Duplicate: true}
				p.sawStored(time.Now())
			}
			return rows.Err()
		}()
	}
	for range b.Len() - nPre - min(len(uOrd), 1) {
		if err != nil {
			break
		}
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		p.kc.forget(s.rooms)
		if pre != nil && isDivisionByZero(err) {
			// The guard: the pipeline's Sync rolled the transaction back,
			// the connection stays usable.
			return errStale
		}
		return err
	}
	if now.Equal(unknownNow) {
		fillNow(s, rs, k, dbNow)
	}
	p.kc.learn(base, k, created)
	return nil
}

func nowArg(now time.Time) *time.Time {
	if now.Equal(unknownNow) {
		return nil
	}
	return &now
}

// fillNow gives the answers and the knowledge of a batch committed from
// what the node knew the transaction's time, read by the guard.
func fillNow(s *pgScratch, rs []*Row, k *knownBatch, now time.Time) {
	ms := unknownNow.UnixMilli()
	for _, ord := range s.uOrd {
		if r := rs[ord]; r.Err == nil && r.TS == ms {
			r.TS = now.UnixMilli()
		}
	}
	for _, ref := range k.refs {
		if ref.ts.Equal(unknownNow) {
			ref.ts = now
		}
	}
	for key, st := range k.reacts {
		if st.ts.Equal(unknownNow) {
			st.ts = now
			k.reacts[key] = st
		}
	}
}

// stateWrite is what a batch changes of one message (its reactions are
// in its refState's counts).
type stateWrite struct {
	edited, deleted bool
	body            []byte
}

// changeWrites are the arrays of a changes commit's writes.
type changeWrites struct {
	room, seq, ref, msgs []int64
	sender               []string
	key, body            [][]byte
	kind                 []int16

	sRoom, sSeq       []int64
	sEdited, sDeleted []bool
	sBody             [][]byte
	sReactions        []string

	text []string // a reaction's, else ""
}

func (w *changeWrites) add(s *pgScratch, j int, seq, msgs int64, text string) {
	body := s.uBody[j]
	if body == nil {
		body = []byte{} // a delete: no body, not NULL
	}
	w.room, w.seq, w.sender, w.key, w.body = append(w.room, s.uRoom[j]), append(w.seq, seq), append(w.sender, s.uSender[j]), append(w.key, s.uKey[j]), append(w.body, body)
	w.kind, w.ref, w.msgs = append(w.kind, s.uKind[j]), append(w.ref, s.uRef[j]), append(w.msgs, msgs)
	w.text = append(w.text, text)
}
