package persist

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strings"
	"sync"

	"github.com/roost-chat/roost/proto"
)

// ReadMark is a user's read position in a room: the newest seq read.
type ReadMark struct {
	Key  string // RoomKey(app, room)
	User string
	Seq  uint64
}

// Reads keeps users' read positions. Positions never move back: a save
// keeps the larger of the stored position and the mark's. Memory and
// Postgres implement it.
type Reads interface {
	// ReadPositionsOf sets each marks[i].Seq to the position of
	// marks[i].User in the room marks[i].Key (0: none), in one read.
	ReadPositionsOf(ctx context.Context, marks []ReadMark) error
	// SaveReads stores marks (at most one per room and user) in one unit
	// of work. A mark of a room that holds no message is dropped: no seq
	// of it can have been read.
	SaveReads(ctx context.Context, marks []ReadMark) error
	// CommitReads is CommitBatch(ctx, rows) that also stores marks as
	// SaveReads does, in the same unit of work (PostgreSQL: the same
	// statement and transaction): both or neither. The group commit writes
	// the coalesced read marks this way, so that they cost no transaction
	// of their own. An error wrapping ErrReadsNotSaved means the rows
	// were committed (their Stored holds the answers) and only the marks
	// were not.
	CommitReads(ctx context.Context, rows []*Row, marks []ReadMark) error
	// Unread fills last[i], read[i] and count[i] for the room keys[i] (all
	// of one app), in one read: the room's newest seq, user's position
	// there (the larger of the stored one and read[i] as given: a floor
	// the caller knows of) and the number of messages (KindMsg entries)
	// after that position, counted without scanning them.
	Unread(ctx context.Context, keys []string, user string, last, read, count []uint64) error
	// ReadPositions lists every user's position in the room key, newest
	// first, at most limit of them.
	ReadPositions(ctx context.Context, key string, limit int) ([]proto.Receipt, error)
}

// ErrReadsNotSaved is CommitReads' error when the rows were committed and
// answered but the marks were not saved: the caller keeps the marks.
var ErrReadsNotSaved = errors.New("read marks not saved")

// memReads is the memory store's read positions: room key -> user -> seq.
type memReads struct {
	mu  sync.Mutex
	pos map[string]map[string]uint64
}

// ReadPositionsOf implements Reads.
func (m *Memory) ReadPositionsOf(_ context.Context, marks []ReadMark) error {
	m.reads.mu.Lock()
	defer m.reads.mu.Unlock()
	for i := range marks {
		marks[i].Seq = m.reads.pos[marks[i].Key][marks[i].User]
	}
	return nil
}

// SaveReads implements Reads.
func (m *Memory) SaveReads(ctx context.Context, marks []ReadMark) error {
	keep := marks[:0:0]
	for _, r := range marks {
		if last, _ := m.LastSeq(ctx, r.Key); last > 0 {
			keep = append(keep, r)
		}
	}
	marks = keep
	m.reads.mu.Lock()
	defer m.reads.mu.Unlock()
	if m.reads.pos == nil {
		m.reads.pos = make(map[string]map[string]uint64)
	}
	for _, r := range marks {
		if r.Seq == 0 {
			continue
		}
		users := m.reads.pos[r.Key]
		if users == nil {
			users = make(map[string]uint64)
			m.reads.pos[r.Key] = users
		}
		users[r.User] = max(users[r.User], r.Seq)
	}
	return nil
}

// CommitReads implements Reads.
func (m *Memory) CommitReads(ctx context.Context, rows []*Row, marks []ReadMark) error {
	if err := m.CommitBatch(ctx, rows); err != nil {
		return err
	}
	return m.SaveReads(ctx, marks)
}

// ReadPositions implements Reads.
func (m *Memory) ReadPositions(_ context.Context, key string, limit int) ([]proto.Receipt, error) {
	m.reads.mu.Lock()
	out := make([]proto.Receipt, 0, len(m.reads.pos[key]))
	for u, s := range m.reads.pos[key] {
		out = append(out, proto.Receipt{User: u, Seq: s})
	}
	m.reads.mu.Unlock()
	slices.SortFunc(out, func(a, b proto.Receipt) int {
		if c := cmp.Compare(b.Seq, a.Seq); c != 0 {
			return c
		}
		return strings.Compare(a.User, b.User)
	})
	return out[:min(len(out), limit)], nil
}

// ReadPositions implements Reads.
func (p *Postgres) ReadPositions(ctx context.Context, key string, limit int) ([]proto.Receipt, error) {
	id, ok, err := p.roomID(ctx, key)
	if err != nil || !ok {
		return nil, err
	}
	rows, err := p.pool.Query(ctx, `SELECT user_id, seq FROM read_positions WHERE room_id = $1 ORDER BY seq DESC, user_id COLLATE "C" LIMIT $2`, id, limit)
	if err != nil {
		return nil, p.wrap("list read positions", err)
	}
	defer rows.Close()
	var out []proto.Receipt
	for rows.Next() {
		var r proto.Receipt
		var seq int64
		if err := rows.Scan(&r.User, &seq); err != nil {
			return nil, p.wrap("list read positions", err)
		}
		r.Seq = uint64(seq)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, p.wrap("list read positions", err)
	}
	return out, nil
}

// Unread implements Reads.
func (m *Memory) Unread(_ context.Context, keys []string, user string, last, read, count []uint64) error {
	m.reads.mu.Lock()
	for i, k := range keys {
		read[i] = max(read[i], m.reads.pos[k][user])
	}
	m.reads.mu.Unlock()
	for i, k := range keys {
		last[i], count[i] = 0, 0
		sh := m.shard(k)
		sh.mu.Lock()
		if room := sh.rooms[k]; room != nil {
			last[i] = room.last
			if read[i] < room.last {
				count[i] = room.msgs - room.msgsUpTo(read[i])
			}
		}
		sh.mu.Unlock()
	}
	return nil
}

// unreadSQL answers every room of an Unread in one statement, the rooms
// given by id. A room's count is its messages (rooms.msgs) less those up to
// the position: the running count the entry at or before the position keeps
// (messages.msgs; NULL on rows stored before kinds existed, when every
// entry was a message and the count was the seq), or, when retention
// removed every entry up to the position, the oldest kept entry's count
// less itself. Position 0 has no entry at or before it, so only the oldest
// kept entry is probed. A room that never had a change (listed_from NULL)
// probes no entry: each entry's count is its seq, and kept_from (migrations
// 0014, 0015) says where the kept entries start, so the count is last_seq
// less the larger of the position and what was removed; the messages probe
// was a third of the statement's index descents and buffers. Index probes
// per room, never a scan. The room and its read position are each probed
// through a LIMIT 1 lateral, which the planner cannot flatten into a join:
// as plain joins the store connections' generic plan could read every room
// (a scan of rooms, then a hash join; seen by (app, name) on a database not
// analyzed yet) and every position of the user, costs that grow with the
// rooms stored, not with the rooms asked (TestPostgresUnreadPlan). By id
// rather than by (app, name): the UNIQUE (app, name) index compares two
// texts by the database's collation at every step of each probe (strcoll
// unless the collation is C), where rooms_pkey compares integers, and the
// node holds the ids already.
const unreadSQL = `
SELECT k.i, r.last_seq, x.pos, CASE WHEN x.pos >= r.last_seq THEN 0 WHEN r.listed_from IS NULL THEN r.msgs - GREATEST(x.pos, r.kept_from - 1) ELSE r.msgs - coalesce(
	CASE WHEN x.pos > 0 THEN (SELECT coalesce(m.msgs, m.seq) FROM messages m WHERE m.room_id = r.id AND m.seq <= x.pos ORDER BY m.seq DESC LIMIT 1) END,
	(SELECT coalesce(m.msgs, m.seq) - (m.kind = 0)::int FROM messages m WHERE m.room_id = r.id AND m.seq > x.pos ORDER BY m.seq LIMIT 1),
	r.msgs) END
FROM unnest($1::int8[], $3::int8[]) WITH ORDINALITY AS k (id, floor, i)
JOIN LATERAL (SELECT r.id, r.last_seq, r.msgs, r.listed_from, r.kept_from FROM rooms r WHERE r.id = k.id LIMIT 1) r ON true
LEFT JOIN LATERAL (SELECT p.seq FROM read_positions p WHERE p.room_id = r.id AND p.user_id = $2 LIMIT 1) rp ON true
CROSS JOIN LATERAL (SELECT GREATEST(coalesce(rp.seq, 0), k.floor) AS pos) x`

// Unread implements Reads: the rooms' ids (storedRooms), then one query
// for every room that exists; a room that does not is left out,
// its last and count 0.
func (p *Postgres) Unread(ctx context.Context, keys []string, user string, last, read, count []uint64) error {
	if len(keys) == 0 {
		return nil
	}
	for i := range keys {
		last[i], count[i] = 0, 0
	}
	ids, at, err := p.storedRooms(ctx, keys)
	if err != nil {
		return err
	}
	floors := make([]int64, len(ids))
	for j, i := range at {
		floors[j] = clampSeq(read[i])
	}
	if len(ids) == 0 {
		return nil
	}
	rows, err := p.pool.Query(ctx, unreadSQL, ids, user, floors)
	if err != nil {
		return p.wrap("read unread counts", err)
	}
	defer rows.Close()
	for rows.Next() {
		var j, l, r, c int64
		if err := rows.Scan(&j, &l, &r, &c); err != nil {
			return p.wrap("read unread counts", err)
		}
		i := at[j-1]
		last[i], read[i], count[i] = uint64(l), uint64(r), uint64(max(c, 0))
	}
	if err := rows.Err(); err != nil {
		return p.wrap("read unread counts", err)
	}
	return nil
}

// ReadPositionsOf implements Reads: the rooms' ids (storedRooms), then one
// query by id and user; a room that does not exist, or a user without a
// position in it, is 0.
func (p *Postgres) ReadPositionsOf(ctx context.Context, marks []ReadMark) error {
	keys := make([]string, len(marks))
	for i := range marks {
		marks[i].Seq = 0
		keys[i] = marks[i].Key
	}
	ids, at, err := p.storedRooms(ctx, keys)
	if err != nil || len(ids) == 0 {
		return err
	}
	users := make([]string, len(ids))
	for j, i := range at {
		users[j] = marks[i].User
	}
	return p.queryByOrdinal(ctx, "read read positions", func(i int, seq int64) { marks[at[i]].Seq = uint64(seq) }, readPositionsOfSQL, ids, users)
}

// readPositionsOfSQL probes read_positions' key once per mark (a LIMIT 1
// lateral, as lastSeqsSQL's, so that a generic plan cannot turn it into a
// scan).
const readPositionsOfSQL = `
SELECT k.i, rp.seq FROM unnest($1::int8[], $2::text[]) WITH ORDINALITY AS k (id, usr, i)
JOIN LATERAL (SELECT rp.seq FROM read_positions rp WHERE rp.room_id = k.id AND rp.user_id = k.usr LIMIT 1) rp ON true`

// SaveReads implements Reads: one statement for the whole batch, rows
// locked in (room, user) order so that two nodes saving overlapping
// batches wait on each other without a cycle.
func (p *Postgres) SaveReads(ctx context.Context, marks []ReadMark) error {
	s := p.scratchPool.Get().(*pgScratch)
	defer func() {
		s.reset(0)
		p.scratchPool.Put(s)
	}()
	s.reset(0)
	if err := p.markIDs(ctx, s, marks); err != nil {
		return err
	}
	return p.saveReadIDs(ctx, s.rRoom, s.rUser, s.rSeq)
}

// markIDs fills s's read arrays with marks, by room id; a mark of a room
// never published to (no id) or of seq 0 is left out.
func (p *Postgres) markIDs(ctx context.Context, s *pgScratch, marks []ReadMark) error {
	for _, r := range marks {
		if r.Seq == 0 {
			continue
		}
		id, ok, err := p.roomID(ctx, r.Key)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		s.rRoom, s.rUser, s.rSeq = append(s.rRoom, id), append(s.rUser, r.User), append(s.rSeq, int64(r.Seq))
	}
	return nil
}

// saveReadsSQL upserts read marks by room id (at most one per room and
// user), locking the rows in (room, user) order as readsCTE does.
const saveReadsSQL = `
INSERT INTO read_positions (room_id, user_id, seq)
SELECT k.r, k.u, k.s FROM unnest($1::bigint[], $2::text[], $3::bigint[]) AS k (r, u, s)
ORDER BY k.r, k.u COLLATE "C"
ON CONFLICT (room_id, user_id) DO UPDATE SET seq = EXCLUDED.seq WHERE read_positions.seq < EXCLUDED.seq`

func (p *Postgres) saveReadIDs(ctx context.Context, ids []int64, users []string, seqs []int64) error {
	if len(ids) == 0 {
		return nil
	}
	_, err := p.pool.Exec(ctx, saveReadsSQL, ids, users, seqs)
	if err != nil {
		return p.wrap("save read positions", err)
	}
	return nil
}

var (
	_ Reads = (*Memory)(nil)
	_ Reads = (*Postgres)(nil)
)
