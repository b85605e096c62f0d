package persist

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/roost-chat/roost/proto"
)

// foldSQL lists messages (kind 0), each joined with its state row when
// it changed: two rows read per listed message at most, however many
// changes lie between them. Until a room's first change (rooms.listed_from,
// migration 0013) every entry is a message, read by the primary key;
// from it on, messages are read by the partial index messages_listed,
// which holds only those (msgs <> seq) and so costs a room's plain
// publishes nothing until it has a change. A merge of the two, ordered,
// reads from each only what the page takes. It reads one message more
// than the limit, to tell more. The state is a subquery per message
// (LIMIT 1 keeps it one), so the plan is a probe of its primary key
// whatever the statistics say.
const (
	foldListedFrom = `(SELECT coalesce(r.listed_from, 9223372036854775807) FROM rooms r WHERE r.id = $1)`
	foldPart       = `(SELECT x.room_id, x.seq, x.idem_key, x.sender, x.ts, x.body FROM messages x
	WHERE x.room_id = $1 AND x.kind = 0 AND %s AND x.seq %s ` + foldListedFrom + `
	ORDER BY x.seq %s LIMIT $3)`
	foldSQL = `SELECT m.seq, m.idem_key, m.sender, m.ts, m.body, st.edited, st.body, coalesce(st.deleted, false), st.reactions
FROM (
	%s
	UNION ALL
	%s
	ORDER BY seq %s LIMIT $3
) m LEFT JOIN LATERAL (
	SELECT s.edited, s.body, s.deleted, s.reactions FROM message_state s WHERE s.room_id = m.room_id AND s.seq = m.seq LIMIT 1
) st ON true
ORDER BY m.seq %[3]s`
)

var (
	foldBackSQL    = foldStatement("x.seq < $2", "DESC")
	foldForwardSQL = foldStatement("x.seq > $2", "ASC")
)

// foldStatement is foldSQL for pages beyond bound, in order.
func foldStatement(bound, order string) string {
	listed := fmt.Sprintf(foldPart, bound+" AND x.msgs <> x.seq", ">=", order)
	before := fmt.Sprintf(foldPart, bound, "<", order)
	return fmt.Sprintf(foldSQL, listed, before, order)
}

var _ Folder = (*Postgres)(nil)

// Fold implements Folder.
func (p *Postgres) Fold(ctx context.Context, key string, q FoldQuery, b Bounds) ([]proto.Message, bool, error) {
	if b.Limit <= 0 {
		return nil, false, nil
	}
	id, ok, err := p.roomID(ctx, key)
	if err != nil || !ok {
		return nil, false, err
	}
	sql, bound := foldBackSQL, int64(math.MaxInt64)
	switch {
	case q.Forward:
		sql, bound = foldForwardSQL, clampSeq(q.After)
	case q.Before == 1:
		return nil, false, nil
	case q.Before != 0:
		bound = clampSeq(q.Before)
	}
	rows, err := p.pool.Query(ctx, sql, id, bound, b.Limit+1)
	if err != nil {
		return nil, false, p.wrap("read folded history", err)
	}
	_, name := proto.SplitKey(key)
	msgs, more, err := scanFolded(rows, name, b)
	if err != nil {
		return nil, false, p.wrap("read folded history", err)
	}
	if !q.Forward {
		for i, j := 0, len(msgs)-1; i < j; i, j = i+1, j-1 {
			msgs[i], msgs[j] = msgs[j], msgs[i]
		}
	}
	return msgs, more, nil
}

// scanFolded reads foldSQL's rows within b.
func scanFolded(rows pgx.Rows, name string, b Bounds) ([]proto.Message, bool, error) {
	defer rows.Close()
	msgs := make([]proto.Message, 0, min(b.Limit, 1024))
	size := 0
	for rows.Next() {
		var seq int64
		var id, body, editBody, reactions []byte
		var from string
		var ts time.Time
		var edited *time.Time
		var deleted bool
		if err := rows.Scan(&seq, &id, &from, &ts, &body, &edited, &editBody, &deleted, &reactions); err != nil {
			return nil, false, err
		}
		m := proto.Message{Room: name, Seq: uint64(seq), ID: string(id), From: from, TS: ts.UnixMilli(), Body: body, Folded: true, Deleted: deleted}
		if edited != nil {
			m.Edited = edited.UnixMilli()
			m.Body = editBody
		}
		if deleted {
			m.Body = nil
		}
		if len(reactions) > 2 {
			var counts map[string]int
			if err := json.Unmarshal(reactions, &counts); err != nil {
				return nil, false, err
			}
			m.Reactions = sortedReactions(counts)
		}
		size += MsgSize(&m)
		if len(msgs) == b.Limit || len(msgs) > 0 && b.MaxBytes > 0 && size > b.MaxBytes {
			return msgs, true, nil
		}
		msgs = append(msgs, m)
	}
	return msgs, false, rows.Err()
}
