package persist

import (
	"context"
	"fmt"
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
// reactions; the rules are then applied here, row after row in batch
// order (an edit of a message of the same batch, a react then an unreact,
// a change after a delete: each answered as if alone); the second writes
// the new entries, the changed messages' state (one row per message and
// batch however many reactions it got) and the rooms' seqs, and commits.
// No read of its own per publish, and no row-at-a-time statement.
const (
	changesLockSQL = `SELECT id, last_seq, msgs, now() FROM rooms WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE`
	changesDupSQL  = `
SELECT i.ord, m.seq, m.ts
FROM unnest($1::int8[], $2::text[], $3::bytea[], $4::int4[]) AS i (room_id, sender, idem_key, ord)
JOIN messages m ON m.room_id = i.room_id AND m.sender = i.sender AND m.idem_key = i.idem_key`
	changesRefSQL = `
SELECT m.room_id, m.seq, m.kind, m.sender, m.ts, coalesce(st.deleted, false)
FROM unnest($1::int8[], $2::int8[]) AS r (room_id, seq)
JOIN messages m ON m.room_id = r.room_id AND m.seq = r.seq
LEFT JOIN message_state st ON st.room_id = m.room_id AND st.seq = m.seq`
	changesReactSQL = `
SELECT x.room_id, x.seq, x.sender, x.reaction, x.entry, x.ts, x.active
FROM unnest($1::int8[], $2::int8[], $3::text[], $4::text[]) AS k (room_id, seq, sender, reaction)
JOIN reactions x ON x.room_id = k.room_id AND x.seq = k.seq AND x.sender = k.sender AND x.reaction = k.reaction`

	changesInsertSQL = `
INSERT INTO messages (room_id, seq, sender, idem_key, ts, body, batch, kind, ref, msgs)
SELECT i.room_id, i.seq, i.sender, i.idem_key, now(), i.body, $9, i.kind, nullif(i.ref, 0), i.msgs
FROM unnest($1::int8[], $2::int8[], $3::text[], $4::bytea[], $5::bytea[], $6::int2[], $7::int8[], $8::int8[])
	AS i (room_id, seq, sender, idem_key, body, kind, ref, msgs)`
	changesEditSQL = `
INSERT INTO message_state AS st (room_id, seq, edited, body)
SELECT room_id, seq, now(), body FROM unnest($1::int8[], $2::int8[], $3::bytea[]) AS e (room_id, seq, body)
ON CONFLICT (room_id, seq) DO UPDATE SET edited = EXCLUDED.edited, body = EXCLUDED.body`
	changesDeleteSQL = `
INSERT INTO message_state AS st (room_id, seq, deleted)
SELECT room_id, seq, true FROM unnest($1::int8[], $2::int8[]) AS d (room_id, seq)
ON CONFLICT (room_id, seq) DO UPDATE SET deleted = true, body = NULL`
	changesReactionsSQL = `
INSERT INTO reactions AS x (room_id, seq, sender, reaction, entry, ts, active)
SELECT room_id, seq, sender, reaction, entry, now(), active
FROM unnest($1::int8[], $2::int8[], $3::text[], $4::text[], $5::int8[], $6::bool[]) AS k (room_id, seq, sender, reaction, entry, active)
ON CONFLICT (room_id, seq, sender, reaction) DO UPDATE SET entry = EXCLUDED.entry, ts = EXCLUDED.ts, active = EXCLUDED.active`
	// changesCountsSQL adds each message's reaction deltas to its counts,
	// dropping those that reach 0: one write per message and batch.
	// (changesStateSQL first makes the state rows that do not exist: a
	// statement cannot update the rows it inserts.)
	changesStateSQL = `
INSERT INTO message_state (room_id, seq) SELECT DISTINCT room_id, seq FROM unnest($1::int8[], $2::int8[]) AS d (room_id, seq)
ON CONFLICT (room_id, seq) DO NOTHING`
	changesCountsSQL = `
WITH d AS (
	SELECT room_id, seq, t, sum(n)::int AS n FROM unnest($1::int8[], $2::int8[], $3::text[], $4::int4[]) AS d (room_id, seq, t, n) GROUP BY 1, 2, 3
), msgs AS (
	SELECT DISTINCT room_id, seq FROM d
), cur AS (
	SELECT s.room_id, s.seq, e.key AS t, e.value::int AS n
	FROM message_state s JOIN msgs USING (room_id, seq), jsonb_each_text(s.reactions) e
), n AS (
	SELECT m.room_id, m.seq, coalesce((
		SELECT jsonb_object_agg(t, n) FROM (
			SELECT t, sum(n) AS n FROM (
				SELECT t, n FROM cur WHERE cur.room_id = m.room_id AND cur.seq = m.seq
				UNION ALL
				SELECT t, n FROM d WHERE d.room_id = m.room_id AND d.seq = m.seq
			) a GROUP BY t
		) b WHERE n > 0), '{}') AS reactions
	FROM msgs m
)
UPDATE message_state st SET reactions = n.reactions FROM n WHERE st.room_id = n.room_id AND st.seq = n.seq`
	changesRoomsSQL = `
UPDATE rooms r SET last_seq = u.l, msgs = u.c FROM unnest($1::int8[], $2::int8[], $3::int8[]) AS u (id, l, c)
WHERE r.id = u.id AND r.last_seq <> u.l`
)

type refKey struct{ room, seq int64 }

type refState struct {
	kind    int16
	sender  string
	ts      time.Time
	deleted bool
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
func (p *Postgres) runChanges(ctx context.Context, conn *pgxpool.Conn, s *pgScratch, rs []*Row, token int64) error {
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
	b.Queue(changesDupSQL, s.uRoom, s.uSender, s.uKey, s.uOrd)
	b.Queue(changesRefSQL, refRooms, refSeqs)
	b.Queue(changesReactSQL, kRooms, kSeqs, kSenders, kTexts)
	br := conn.SendBatch(ctx, b)
	rooms := make(map[int64]*roomSeqs, len(s.rooms))
	dups := make(map[int32]Stored)
	refs := make(map[refKey]*refState, len(refRooms))
	reacts := make(map[reactKey]reactState, len(kRooms))
	var now time.Time
	err := func() error {
		if _, err := br.Exec(); err != nil {
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
			var ord int32
			var seq int64
			var ts time.Time
			if err := rows.Scan(&ord, &seq, &ts); err != nil {
				return err
			}
			dups[ord] = Stored{Seq: uint64(seq), TS: ts.UnixMilli(), Duplicate: true}
		}
		if err := rows.Err(); err != nil {
			return err
		}
		rows, _ = br.Query()
		for rows.Next() {
			var k refKey
			var st refState
			if err := rows.Scan(&k.room, &k.seq, &st.kind, &st.sender, &st.ts, &st.deleted); err != nil {
				return err
			}
			refs[k] = &st
		}
		if err := rows.Err(); err != nil {
			return err
		}
		rows, _ = br.Query()
		for rows.Next() {
			var k reactKey
			var st reactState
			if err := rows.Scan(&k.room, &k.seq, &k.sender, &k.text, &st.entry, &st.ts, &st.active); err != nil {
				return err
			}
			reacts[k] = st
		}
		return rows.Err()
	}()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}

	// The rules, in batch order.
	var w changeWrites
	edits := map[refKey]int{} // message → index in w.edit*
	deletes := map[refKey]bool{}
	reactW := map[reactKey]int{} // reaction → index in w.r*
	type delta struct {
		refKey
		text string
	}
	deltas := map[delta]int32{}
	nowMS := now.UnixMilli()
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
				continue
			}
			if (kind == proto.KindEdit || kind == proto.KindDelete) && !s.uAny[j] && ref.sender != s.uSender[j] {
				r.Stored = Stored{Err: proto.ErrRefForbidden}
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
					continue
				}
			}
		}
		room.last++
		if kind == proto.KindMsg {
			room.msgs++
			// A change later in the batch may name it.
			refs[refKey{s.uRoom[j], room.last}] = &refState{kind: int16(proto.KindMsg), sender: s.uSender[j], ts: now}
		}
		seq := room.last
		w.add(s, j, seq, room.msgs)
		r.Stored = Stored{Seq: uint64(seq), TS: nowMS}
		switch kind {
		case proto.KindEdit:
			if i, ok := edits[rk]; ok {
				w.editBody[i] = s.uBody[j]
			} else {
				edits[rk] = len(w.editRoom)
				w.editRoom, w.editSeq, w.editBody = append(w.editRoom, rk.room), append(w.editSeq, rk.seq), append(w.editBody, s.uBody[j])
			}
		case proto.KindDelete:
			refs[rk].deleted = true
			if !deletes[rk] {
				deletes[rk] = true
				w.delRoom, w.delSeq = append(w.delRoom, rk.room), append(w.delSeq, rk.seq)
			}
		case proto.KindReact, proto.KindUnreact:
			on := kind == proto.KindReact
			k := reactKey{rk.room, rk.seq, s.uSender[j], text}
			reacts[k] = reactState{entry: seq, ts: now, active: on}
			if i, ok := reactW[k]; ok {
				w.rEntry[i], w.rActive[i] = seq, on
			} else {
				reactW[k] = len(w.rRoom)
				w.rRoom, w.rSeq, w.rSender, w.rText = append(w.rRoom, rk.room), append(w.rSeq, rk.seq), append(w.rSender, k.sender), append(w.rText, text)
				w.rEntry, w.rActive = append(w.rEntry, seq), append(w.rActive, on)
			}
			if on {
				deltas[delta{rk, text}]++
			} else {
				deltas[delta{rk, text}]--
			}
		}
	}
	for d, n := range deltas {
		if n != 0 {
			w.dRoom, w.dSeq, w.dText, w.dN = append(w.dRoom, d.room), append(w.dSeq, d.seq), append(w.dText, d.text), append(w.dN, n)
		}
	}
	var rIDs, rLast, rMsgs []int64
	for id, r := range rooms {
		rIDs, rLast, rMsgs = append(rIDs, id), append(rLast, r.last), append(rMsgs, r.msgs)
	}

	// The writes and the commit, in one round trip.
	b = &pgx.Batch{}
	if len(w.room) > 0 {
		b.Queue(changesInsertSQL, w.room, w.seq, w.sender, w.key, w.body, w.kind, w.ref, w.msgs, token)
	}
	if len(w.editRoom) > 0 {
		b.Queue(changesEditSQL, w.editRoom, w.editSeq, w.editBody)
	}
	if len(w.delRoom) > 0 {
		b.Queue(changesDeleteSQL, w.delRoom, w.delSeq)
	}
	if len(w.rRoom) > 0 {
		b.Queue(changesReactionsSQL, w.rRoom, w.rSeq, w.rSender, w.rText, w.rEntry, w.rActive)
	}
	if len(w.dRoom) > 0 {
		b.Queue(changesStateSQL, w.dRoom, w.dSeq)
		b.Queue(changesCountsSQL, w.dRoom, w.dSeq, w.dText, w.dN)
	}
	if len(s.rRoom) > 0 {
		b.Queue(saveReadsSQL, s.rRoom, s.rUser, s.rSeq) // the group commit's read marks (CommitReads)
	}
	b.Queue(changesRoomsSQL, rIDs, rLast, rMsgs)
	b.Queue("COMMIT")
	br = conn.SendBatch(ctx, b)
	for range b.Len() {
		if _, err = br.Exec(); err != nil {
			break
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// changeWrites are the arrays of a changes commit's writes.
type changeWrites struct {
	room, seq, ref, msgs []int64
	sender               []string
	key, body            [][]byte
	kind                 []int16

	editRoom, editSeq []int64
	editBody          [][]byte
	delRoom, delSeq   []int64

	rRoom, rSeq, rEntry []int64
	rSender, rText      []string
	rActive             []bool

	dRoom, dSeq []int64
	dText       []string
	dN          []int32
}

func (w *changeWrites) add(s *pgScratch, j int, seq, msgs int64) {
	body := s.uBody[j]
	if body == nil {
		body = []byte{} // a delete: no body, not NULL
	}
	w.room, w.seq, w.sender, w.key, w.body = append(w.room, s.uRoom[j]), append(w.seq, seq), append(w.sender, s.uSender[j]), append(w.key, s.uKey[j]), append(w.body, body)
	w.kind, w.ref, w.msgs = append(w.kind, s.uKind[j]), append(w.ref, s.uRef[j]), append(w.msgs, msgs)
}
