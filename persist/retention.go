package persist

import (
	"context"
	"fmt"
	"time"
)

// retentionBatch bounds the rows one DELETE removes, so each statement is
// short and holds its row locks briefly; publishes never wait on retention
// (it deletes the oldest rows, they insert the newest).
const retentionBatch = 1000

// SetRetention sets an app's limits, creating the app if needed: messages
// older than maxAge (0: no age limit) and beyond the newest maxCount per
// room (0: no count limit) are deleted by the retention job. A deleted
// message's idempotency key is forgotten with it.
func (p *Postgres) SetRetention(ctx context.Context, app string, maxAge time.Duration, maxCount int) error {
	var age *string
	if maxAge > 0 {
		s := fmt.Sprintf("%d milliseconds", maxAge.Milliseconds())
		age = &s
	}
	var count *int32
	if maxCount > 0 {
		c := int32(min(maxCount, 1<<31-1))
		count = &c
	}
	_, err := p.pool.Exec(ctx, `
INSERT INTO apps (id, max_age, max_count) VALUES ($1, $2::interval, $3)
ON CONFLICT (id) DO UPDATE SET max_age = EXCLUDED.max_age, max_count = EXCLUDED.max_count`, app, age, count)
	if err != nil {
		return p.wrap("set retention", err)
	}
	return nil
}

// StartRetention runs EnforceRetention every interval until ctx is done or
// the store is closed. Call it once.
func (p *Postgres) StartRetention(ctx context.Context, every time.Duration) {
	ctx, cancel := context.WithCancel(ctx)
	p.retainMu.Lock()
	defer p.retainMu.Unlock()
	if p.stopRetain != nil || p.closed.Load() {
		cancel()
		return
	}
	p.stopRetain = cancel
	p.retainDone = make(chan struct{})
	go func() {
		defer close(p.retainDone)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			start := time.Now()
			n, err := p.EnforceRetention(ctx)
			if err != nil && ctx.Err() == nil {
				p.log.Warn("persist: retention failed; retrying next round", "err", err)
			} else if n > 0 {
				p.log.Info("persist: retention deleted messages", "messages", n, "duration", time.Since(start))
			}
		}
	}()
}

// EnforceRetention deletes, once, the messages beyond each app's limits,
// oldest first, in batches of retentionBatch rows per statement. It returns
// the number of messages deleted.
func (p *Postgres) EnforceRetention(ctx context.Context) (int64, error) {
	type appLimit struct {
		id       string
		ageSecs  *float64
		maxCount *int64
	}
	rows, err := p.pool.Query(ctx, `
SELECT id, extract(epoch FROM max_age)::float8, max_count::int8 FROM apps
WHERE max_age IS NOT NULL OR max_count IS NOT NULL`)
	if err != nil {
		return 0, p.wrap("list app retention", err)
	}
	var apps []appLimit
	for rows.Next() {
		var a appLimit
		if err := rows.Scan(&a.id, &a.ageSecs, &a.maxCount); err != nil {
			rows.Close()
			return 0, p.wrap("list app retention", err)
		}
		apps = append(apps, a)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, p.wrap("list app retention", err)
	}
	var deleted int64
	for _, a := range apps {
		n, err := p.retainApp(ctx, a.id, a.ageSecs, a.maxCount)
		deleted += n
		if err != nil {
			return deleted, err
		}
	}
	return deleted, nil
}

func (p *Postgres) retainApp(ctx context.Context, app string, ageSecs *float64, maxCount *int64) (int64, error) {
	type room struct{ id, last int64 }
	rows, err := p.pool.Query(ctx, `SELECT id, last_seq FROM rooms WHERE app = $1`, app)
	if err != nil {
		return 0, p.wrap("list rooms for retention", err)
	}
	var rooms []room
	for rows.Next() {
		var r room
		if err := rows.Scan(&r.id, &r.last); err != nil {
			rows.Close()
			return 0, p.wrap("list rooms for retention", err)
		}
		rooms = append(rooms, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, p.wrap("list rooms for retention", err)
	}
	var deleted int64
	for _, r := range rooms {
		if maxCount != nil && r.last > *maxCount {
			// Both scans walk the primary key from the room's oldest row.
			n, err := p.deleteLoop(ctx, `
DELETE FROM messages WHERE room_id = $1 AND seq IN (
	SELECT seq FROM messages WHERE room_id = $1 AND seq <= $2 ORDER BY seq LIMIT $3)`,
				r.id, r.last-*maxCount)
			deleted += n
			if err != nil {
				return deleted, err
			}
		}
		if ageSecs != nil {
			// Seq order is commit order, so the expired rows are the oldest
			// ones: stop at the first batch that is not all expired.
			n, err := p.deleteLoop(ctx, `
DELETE FROM messages WHERE room_id = $1 AND seq IN (
	SELECT seq FROM messages WHERE room_id = $1 ORDER BY seq LIMIT $3)
AND ts < now() - make_interval(secs => $2)`,
				r.id, *ageSecs)
			deleted += n
			if err != nil {
				return deleted, err
			}
		}
	}
	return deleted, nil
}

// deleteLoop runs a batched DELETE ($3 is the batch size) until it removes
// less than a full batch.
func (p *Postgres) deleteLoop(ctx context.Context, sql string, roomID int64, arg any) (int64, error) {
	var deleted int64
	for {
		tag, err := p.pool.Exec(ctx, sql, roomID, arg, retentionBatch)
		if err != nil {
			return deleted, p.wrap("delete expired messages", err)
		}
		deleted += tag.RowsAffected()
		if tag.RowsAffected() < retentionBatch {
			return deleted, nil
		}
	}
}
