package persist

import (
	"context"
	"errors"
	"sync"

	"github.com/jackc/pgx/v5"
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
	// ReadPosition is user's position in the room key (0: none).
	ReadPosition(ctx context.Context, key, user string) (uint64, error)
	// SaveReads stores marks (at most one per room and user) in one unit
	// of work. A mark of a room that holds no message is dropped: no seq
	// of it can have been read.
	SaveReads(ctx context.Context, marks []ReadMark) error
}

// memReads is the memory store's read positions: room key -> user -> seq.
type memReads struct {
	mu  sync.Mutex
	pos map[string]map[string]uint64
}

// ReadPosition implements Reads.
func (m *Memory) ReadPosition(_ context.Context, key, user string) (uint64, error) {
	m.reads.mu.Lock()
	defer m.reads.mu.Unlock()
	return m.reads.pos[key][user], nil
}

// SaveReads implements Reads.
func (m *Memory) SaveReads(_ context.Context, marks []ReadMark) error {
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

// ReadPosition implements Reads.
func (p *Postgres) ReadPosition(ctx context.Context, key, user string) (uint64, error) {
	id, ok, err := p.roomID(ctx, key)
	if err != nil || !ok {
		return 0, err
	}
	var seq int64
	err = p.pool.QueryRow(ctx, `SELECT seq FROM read_positions WHERE room_id = $1 AND user_id = $2`, id, user).Scan(&seq)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, p.wrap("read a read position", err)
	}
	return uint64(seq), nil
}

// SaveReads implements Reads: one statement for the whole batch, rows
// locked in (room, user) order so that two nodes saving overlapping
// batches wait on each other without a cycle.
func (p *Postgres) SaveReads(ctx context.Context, marks []ReadMark) error {
	ids := make([]int64, 0, len(marks))
	users := make([]string, 0, len(marks))
	seqs := make([]int64, 0, len(marks))
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
		ids, users, seqs = append(ids, id), append(users, r.User), append(seqs, int64(r.Seq))
	}
	if len(ids) == 0 {
		return nil
	}
	_, err := p.pool.Exec(ctx, `
INSERT INTO read_positions (room_id, user_id, seq)
SELECT r, u, s FROM unnest($1::bigint[], $2::text[], $3::bigint[]) AS k (r, u, s) ORDER BY r, u COLLATE "C"
ON CONFLICT (room_id, user_id) DO UPDATE SET seq = GREATEST(read_positions.seq, EXCLUDED.seq)`, ids, users, seqs)
	if err != nil {
		return p.wrap("save read positions", err)
	}
	return nil
}

var (
	_ Reads = (*Memory)(nil)
	_ Reads = (*Postgres)(nil)
)
