package persist

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/roost-chat/roost/proto"
)

// Durable webhooks (migrations/0004_webhook_cursors.sql): what a webhook
// is owed is the messages of a room past its cursor, so a commit writes
// nothing for webhooks; the delivering node advances the cursor once per
// POST. A node delivers a room only while it holds the room's lease, which
// keeps the room's events in seq order with several nodes and lets them
// share an app's rooms.

// HookRoom is one room's webhook cursor as a delivering node sees it.
type HookRoom struct {
	ID        int64  // rooms.id
	Key       string // app/room
	Delivered uint64 // events up to this seq were answered 2xx (or dead-lettered)
	Last      uint64 // the room's newest committed seq when read
}

// HookRoomID returns the id of an existing room (cached after first use).
func (p *Postgres) HookRoomID(ctx context.Context, key string) (int64, bool, error) {
	return p.roomID(ctx, key)
}

func leaseInterval(d time.Duration) string { return fmt.Sprintf("%d milliseconds", d.Milliseconds()) }

// ClaimHookRooms takes or renews the lease of rooms for owner and returns
// the cursors of those it holds now; a room leased by another node whose
// lease has not run out is left out. Rooms are locked in id order, so
// nodes claiming overlapping rooms wait rather than deadlock.
func (p *Postgres) ClaimHookRooms(ctx context.Context, owner string, lease time.Duration, ids []int64) ([]HookRoom, error) {
	ids = slices.Clone(ids)
	slices.Sort(ids)
	rows, err := p.pool.Query(ctx, `
WITH cl AS (
	INSERT INTO webhook_cursors AS c (room_id, app, owner, lease_until)
	SELECT r.id, r.app, $2, now() + $3::interval FROM rooms r WHERE r.id = ANY($1) ORDER BY r.id
	ON CONFLICT (room_id) DO UPDATE SET owner = EXCLUDED.owner, lease_until = EXCLUDED.lease_until
	WHERE c.owner IS NULL OR c.owner = EXCLUDED.owner OR c.lease_until < now()
	RETURNING c.room_id, c.delivered
)
SELECT cl.room_id, r.app, r.name, cl.delivered, r.last_seq FROM cl JOIN rooms r ON r.id = cl.room_id`,
		ids, owner, leaseInterval(lease))
	if err != nil {
		return nil, p.wrap("claim webhook rooms", err)
	}
	return scanHookRooms(rows, p, "claim webhook rooms")
}

func scanHookRooms(rows pgx.Rows, p *Postgres, what string) ([]HookRoom, error) {
	defer rows.Close()
	var out []HookRoom
	for rows.Next() {
		var h HookRoom
		var app, name string
		var d, l int64
		if err := rows.Scan(&h.ID, &app, &name, &d, &l); err != nil {
			return nil, p.wrap(what, err)
		}
		h.Key, h.Delivered, h.Last = proto.RoomKey(app, name), uint64(d), uint64(l)
		p.cacheRoom(h.Key, h.ID)
		out = append(out, h)
	}
	if err := rows.Err(); err != nil {
		return nil, p.wrap(what, err)
	}
	return out, nil
}

// AdvanceHookRooms records delivered[i] for ids[i] where owner still holds
// the lease, and renews the lease (release: gives it up). It returns the
// rooms it advanced, with their newest seq: one missing from the answer
// was taken by another node (its lease ran out), and a Last above
// Delivered is owed (published through another node, say).
func (p *Postgres) AdvanceHookRooms(ctx context.Context, owner string, lease time.Duration, ids []int64, delivered []uint64, release bool) ([]HookRoom, error) {
	type pair struct {
		id int64
		d  uint64
	}
	ps := make([]pair, len(ids))
	for i := range ids {
		ps[i] = pair{ids[i], delivered[i]}
	}
	slices.SortFunc(ps, func(a, b pair) int { return int(min(max(a.id-b.id, -1), 1)) })
	sid := make([]int64, len(ps))
	sd := make([]int64, len(ps))
	for i, x := range ps {
		sid[i], sd[i] = x.id, int64(x.d)
	}
	// The cursors are locked in id order first, the order ClaimHookRooms
	// takes them in: the update's own order follows its join plan, and a
	// claim of a lease that ran out, meeting an advance of the same rooms
	// in another order, would deadlock.
	rows, err := p.pool.Query(ctx, `
WITH v AS (SELECT * FROM unnest($1::int8[], $2::int8[]) AS v (room_id, delivered)),
locked AS MATERIALIZED (
	SELECT c.room_id FROM webhook_cursors c WHERE c.room_id = ANY($1) AND c.owner = $3
	ORDER BY c.room_id FOR NO KEY UPDATE
),
u AS (
	UPDATE webhook_cursors c SET delivered = greatest(c.delivered, v.delivered),
		owner = CASE WHEN $5 THEN NULL ELSE c.owner END,
		lease_until = CASE WHEN $5 THEN NULL ELSE now() + $4::interval END
	FROM v JOIN locked l ON l.room_id = v.room_id WHERE c.room_id = v.room_id AND c.owner = $3
	RETURNING c.room_id, c.delivered
)
SELECT u.room_id, r.app, r.name, u.delivered, r.last_seq FROM u JOIN rooms r ON r.id = u.room_id`,
		sid, sd, owner, leaseInterval(lease), release)
	if err != nil {
		return nil, p.wrap("advance webhook cursors", err)
	}
	return scanHookRooms(rows, p, "advance webhook cursors")
}

// OwedHookRooms lists up to limit rooms of app with messages past their
// cursor that owner may claim (no lease, its own, or one that ran out):
// the work a crashed node left, or that arrived through a node that does
// not deliver the room. It reads the app's part of the rooms index.
func (p *Postgres) OwedHookRooms(ctx context.Context, app, owner string, limit int) ([]HookRoom, error) {
	rows, err := p.pool.Query(ctx, `
SELECT r.id, r.app, r.name, coalesce(c.delivered, 0), r.last_seq
FROM rooms r LEFT JOIN webhook_cursors c ON c.room_id = r.id
WHERE r.app = $1 AND r.last_seq > coalesce(c.delivered, 0)
	AND (c.owner IS NULL OR c.owner = $2 OR c.lease_until < now())
ORDER BY r.id LIMIT $3`, app, owner, limit)
	if err != nil {
		return nil, p.wrap("read owed webhook rooms", err)
	}
	return scanHookRooms(rows, p, "read owed webhook rooms")
}

// startHookCursors makes only messages from now on owed to the app's
// webhook in the rooms that match it now but did not match before (all of
// them when before is nil): their cursors move to their newest seq. Rooms
// that matched before keep what they are owed.
func startHookCursors(ctx context.Context, q pgx.Tx, app string, before, after *proto.Webhook) error {
	if after == nil || after.URL == "" {
		return nil
	}
	rows, err := q.Query(ctx, `SELECT id, name, last_seq FROM rooms WHERE app = $1`, app)
	if err != nil {
		return err
	}
	var ids, lasts []int64
	for rows.Next() {
		var id, last int64
		var name string
		if err := rows.Scan(&id, &name, &last); err != nil {
			rows.Close()
			return err
		}
		if after.Wants(name) && (before == nil || before.URL == "" || !before.Wants(name)) {
			ids, lasts = append(ids, id), append(lasts, last)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if len(ids) == 0 {
		return nil
	}
	_, err = q.Exec(ctx, `
INSERT INTO webhook_cursors (room_id, app, delivered)
SELECT id, $3, last FROM unnest($1::int8[], $2::int8[]) AS v (id, last) ORDER BY id
ON CONFLICT (room_id) DO UPDATE SET delivered = greatest(webhook_cursors.delivered, EXCLUDED.delivered)`, ids, lasts, app)
	return err
}

// eventsKeep is how long a delivered connection event stays stored: long
// past any retry of its commit (whose idempotency key finds it), short
// enough that an app's events room holds only minutes of transitions.
const eventsKeep = 10 * time.Minute

// TrimHookEvents deletes the connection events of app (its
// proto.EventsRoom) that its webhook was delivered, once older than
// eventsKeep, at most limit of them; it returns how many it deleted. An
// events room is no history anyone reads: what is delivered is done with.
func (p *Postgres) TrimHookEvents(ctx context.Context, app string, limit int) (int64, error) {
	tag, err := p.pool.Exec(ctx, `
WITH r AS (SELECT r.id, c.delivered FROM rooms r JOIN webhook_cursors c ON c.room_id = r.id WHERE r.app = $1 AND r.name = $2)
DELETE FROM messages m USING r WHERE m.room_id = r.id AND m.seq IN (
	SELECT seq FROM messages WHERE room_id = r.id AND seq <= r.delivered ORDER BY seq LIMIT $3)
AND m.ts < now() - $4::interval`, app, proto.EventsRoom, limit, leaseInterval(eventsKeep))
	if err != nil {
		return 0, p.wrap("trim connection events", err)
	}
	return tag.RowsAffected(), nil
}

// DeadLetter is a batch of one room's events a receiver did not take
// within the app's max age.
type DeadLetter struct {
	ID         int64      `json:"id"`
	App        string     `json:"app"`
	Room       string     `json:"room"`
	FromSeq    uint64     `json:"from_seq"`
	ToSeq      uint64     `json:"to_seq"`
	FailedAt   time.Time  `json:"failed_at"`
	LastError  string     `json:"last_error"`
	Events     int        `json:"events"`
	ReplayedAt *time.Time `json:"replayed_at,omitempty"`
	Body       []byte     `json:"-"` // the events, a JSON array
}

// AddDeadLetter records events (a JSON array of one room's events, from..to)
// as dead and moves the room's cursor past them, in one transaction, if
// owner still holds the room's lease; ok is false otherwise (another node
// delivers the room now, and nothing is written).
func (p *Postgres) AddDeadLetter(ctx context.Context, owner string, roomID int64, key string, from, to uint64, lastErr string, events []byte, n int) (ok bool, err error) {
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		return false, p.wrap("record dead webhook events", err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // no-op after Commit
	tag, err := tx.Exec(ctx, `UPDATE webhook_cursors SET delivered = greatest(delivered, $2) WHERE room_id = $1 AND owner = $3`, roomID, int64(to), owner)
	if err != nil {
		return false, p.wrap("record dead webhook events", err)
	}
	if tag.RowsAffected() == 0 {
		return false, nil
	}
	app, room := proto.SplitKey(key)
	if _, err := tx.Exec(ctx, `INSERT INTO webhook_dead (app, room, from_seq, to_seq, last_error, events, n_events) VALUES ($1, $2, $3, $4, $5, $6, $7)`,
		app, room, int64(from), int64(to), lastErr, events, n); err != nil {
		return false, p.wrap("record dead webhook events", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, p.wrap("record dead webhook events", err)
	}
	return true, nil
}

// ErrNoDeadLetter means no dead letter has the id given.
var ErrNoDeadLetter = errors.New("no such dead letter")

const deadColumns = `id, app, room, from_seq, to_seq, failed_at, last_error, events, n_events, replayed_at`

func scanDead(row pgx.Row) (DeadLetter, error) {
	var d DeadLetter
	var from, to int64
	var body []byte
	if err := row.Scan(&d.ID, &d.App, &d.Room, &from, &to, &d.FailedAt, &d.LastError, &body, &d.Events, &d.ReplayedAt); err != nil {
		return d, err
	}
	d.FromSeq, d.ToSeq, d.Body = uint64(from), uint64(to), body
	return d, nil
}

// DeadLetters lists the dead letters of app (every app if ""), oldest
// first, up to limit.
func (p *Postgres) DeadLetters(ctx context.Context, app string, limit int) ([]DeadLetter, error) {
	rows, err := p.pool.Query(ctx, `SELECT `+deadColumns+` FROM webhook_dead WHERE $1 = '' OR app = $1 ORDER BY id LIMIT $2`, app, limit)
	if err != nil {
		return nil, p.wrap("read dead letters", err)
	}
	defer rows.Close()
	var out []DeadLetter
	for rows.Next() {
		d, err := scanDead(rows)
		if err != nil {
			return nil, p.wrap("read dead letters", err)
		}
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, p.wrap("read dead letters", err)
	}
	return out, nil
}

// GetDeadLetter reads one dead letter.
func (p *Postgres) GetDeadLetter(ctx context.Context, id int64) (DeadLetter, error) {
	d, err := scanDead(p.pool.QueryRow(ctx, `SELECT `+deadColumns+` FROM webhook_dead WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return d, fmt.Errorf("cannot read dead letter %d: %w", id, ErrNoDeadLetter)
	}
	if err != nil {
		return d, p.wrap("read dead letter", err)
	}
	return d, nil
}

// MarkReplayed records that dead letter id was sent again.
func (p *Postgres) MarkReplayed(ctx context.Context, id int64) error {
	if _, err := p.pool.Exec(ctx, `UPDATE webhook_dead SET replayed_at = now() WHERE id = $1`, id); err != nil {
		return p.wrap("mark dead letter replayed", err)
	}
	return nil
}
