package persist

import (
	"context"
	"maps"
	"sync/atomic"
	"time"
)

// Retention bounds how much of a room's history is kept.
type Retention struct {
	MaxAge   time.Duration // messages older than this are removed; 0: no age limit
	MaxCount int           // only the newest MaxCount per room are kept; 0: no count limit
}

// IsZero reports a retention that keeps everything.
func (r Retention) IsZero() bool { return r.MaxAge <= 0 && r.MaxCount <= 0 }

// RetentionPolicy is the operator's retention: Default for every app,
// Apps for the apps that have their own.
type RetentionPolicy struct {
	Default Retention
	Apps    map[string]Retention
}

// For returns the retention of app and whether the policy names app itself.
func (p *RetentionPolicy) For(app string) (Retention, bool) {
	if r, ok := p.Apps[app]; ok {
		return r, true
	}
	return p.Default, false
}

// RetentionStats counts what retention removed, by rule, since the store
// was opened; a member that rejoins behind what was removed is told so
// (recovered false), and these counters say how often that can happen.
type RetentionStats struct {
	DeletedByAge   uint64 // messages older than their app's max age
	DeletedByCount uint64 // messages beyond their app's max count (memory store: beyond --keep)
	Runs           uint64 // retention rounds completed
	Errors         uint64 // retention rounds that failed (retried next round)
}

// retentionCounters are the atomics behind RetentionStats.
type retentionCounters struct {
	byAge, byCount, runs, errors atomic.Uint64
}

func (c *retentionCounters) stats() RetentionStats {
	return RetentionStats{DeletedByAge: c.byAge.Load(), DeletedByCount: c.byCount.Load(), Runs: c.runs.Load(), Errors: c.errors.Load()}
}

// retentionBatch bounds the rows one DELETE removes, so each statement is
// short and holds its row locks briefly; publishes never wait on retention
// (it deletes the oldest rows, they insert the newest).
const retentionBatch = 1000

// SetRetentionPolicy sets the operator's retention (flags). Call it before
// StartRetention.
func (p *Postgres) SetRetentionPolicy(pol RetentionPolicy) {
	p.retainMu.Lock()
	p.policy = pol
	p.retainMu.Unlock()
}

// SetAppRetention makes apps' own retention the given map's (the
// keep_age and keep_count of an app registry kept in a file, --apps), in
// place of the apps table's max_age and max_count, which only a registry
// kept in PostgreSQL writes. An app absent has the default. Any goroutine;
// it applies from the next retention round.
func (p *Postgres) SetAppRetention(apps map[string]Retention) {
	reg := maps.Clone(apps)
	if reg == nil {
		reg = map[string]Retention{}
	}
	p.retainMu.Lock()
	p.fileRetention = reg
	p.retainMu.Unlock()
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
func (p *Postgres) EnforceRetention(ctx context.Context) (n int64, err error) {
	defer func() {
		if err != nil {
			p.ret.errors.Add(1)
		} else {
			p.ret.runs.Add(1)
		}
	}()
	p.retainMu.Lock()
	pol, fileRet := p.policy, p.fileRetention
	p.retainMu.Unlock()
	type appLimit struct {
		id  string
		ret Retention
	}
	rows, err := p.pool.Query(ctx, `SELECT id, (extract(epoch FROM max_age) * 1000)::int8, max_count::int8 FROM apps`)
	if err != nil {
		return 0, p.wrap("list app retention", err)
	}
	var apps []appLimit
	for rows.Next() {
		var id string
		var ageMS, count *int64
		if err := rows.Scan(&id, &ageMS, &count); err != nil {
			rows.Close()
			return 0, p.wrap("list app retention", err)
		}
		ret, named := pol.For(id)
		if fileRet != nil {
			ageMS, count = nil, nil // the file is the registry: the columns are not
			if r, ok := fileRet[id]; ok && !named {
				ret = r
			}
		}
		if !named && (ageMS != nil || count != nil) {
			ret = Retention{}
			if ageMS != nil {
				ret.MaxAge = time.Duration(*ageMS) * time.Millisecond
			}
			if count != nil {
				ret.MaxCount = int(*count)
			}
		}
		if !ret.IsZero() {
			apps = append(apps, appLimit{id, ret})
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, p.wrap("list app retention", err)
	}
	var deleted int64
	for _, a := range apps {
		n, err := p.retainApp(ctx, a.id, a.ret)
		deleted += n
		if err != nil {
			return deleted, err
		}
	}
	return deleted, nil
}

func (p *Postgres) retainApp(ctx context.Context, app string, ret Retention) (int64, error) {
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
		if ret.MaxCount > 0 && r.last > int64(ret.MaxCount) {
			// Both scans walk the primary key from the room's oldest row.
			n, err := p.deleteLoop(ctx, `
UPDATE rooms SET kept_from = b.upto + 1
FROM (SELECT max(seq) AS upto FROM (
	SELECT seq FROM messages WHERE room_id = $1 AND seq <= $2 ORDER BY seq LIMIT $3) x) b
WHERE id = $1 AND kept_from <= b.upto`, withChanges(`
DELETE FROM messages WHERE room_id = $1 AND seq IN (
	SELECT seq FROM messages WHERE room_id = $1 AND seq <= $2
		AND seq < (SELECT kept_from FROM rooms WHERE id = $1) ORDER BY seq LIMIT $3)`),
				r.id, r.last-int64(ret.MaxCount))
			deleted += n
			p.ret.byCount.Add(uint64(n))
			if err != nil {
				return deleted, err
			}
		}
		if ret.MaxAge > 0 {
			// Seq order is commit order, so the expired rows are the oldest
			// ones: stop at the first batch that is not all expired.
			n, err := p.deleteLoop(ctx, `
UPDATE rooms SET kept_from = b.upto + 1
FROM (SELECT max(seq) AS upto FROM (
	SELECT seq, ts FROM messages WHERE room_id = $1 ORDER BY seq LIMIT $3) x
	WHERE ts < now() - make_interval(secs => $2)) b
WHERE id = $1 AND kept_from <= b.upto`, withChanges(`
DELETE FROM messages WHERE room_id = $1 AND seq IN (
	SELECT seq FROM messages WHERE room_id = $1 ORDER BY seq LIMIT $3)
AND ts < now() - make_interval(secs => $2) AND seq < (SELECT kept_from FROM rooms WHERE id = $1)`),
				r.id, ret.MaxAge.Seconds())
			deleted += n
			p.ret.byAge.Add(uint64(n))
			if err != nil {
				return deleted, err
			}
		}
	}
	return deleted, nil
}

// withChanges makes del, a DELETE of a room's oldest entries, remove with
// each message its changes (edits, deletes, reactions: newer entries that
// name it, found by messages_changes) and its state; the users' standing reactions
// are those entries.
// The changes removed are those newer than every entry del removes, so no
// row is removed twice. It answers the entries del removed and the changes.
func withChanges(del string) string {
	return `
WITH d AS (` + del + `
	RETURNING seq, kind
), dep AS (
	-- Each removed message's changes by messages_changes, one probe each
	-- (never a walk of the room's newer rows), deleted by their ctids: a
	-- plan that stays the same whatever the statistics say. OFFSET 0 keeps
	-- the seq bound out of the probe: pushed into it, a generic plan made
	-- on a small table scanned the room's changes newer than the bound by
	-- (room_id, seq) once per removed message.
	DELETE FROM messages m WHERE m.ctid = ANY (ARRAY(
		SELECT c.ctid FROM d, LATERAL (
			SELECT x.ctid, x.seq FROM messages x WHERE x.room_id = $1 AND x.ref = d.seq AND x.ref IS NOT NULL OFFSET 0
		) c WHERE d.kind = 0 AND c.seq > (SELECT max(seq) FROM d)))
	RETURNING 1
), st AS (
	DELETE FROM message_state s WHERE s.ctid = ANY (ARRAY(
		SELECT c.ctid FROM d, LATERAL (SELECT y.ctid FROM message_state y WHERE y.room_id = $1 AND y.seq = d.seq LIMIT 1) c WHERE d.kind = 0))
)
SELECT (SELECT count(*) FROM d), (SELECT count(*) FROM dep)`
}

// deleteLoop runs a batched DELETE of withChanges ($3 is the batch size)
// until it removes less than a full batch. Before each DELETE, raise
// moves the room's kept_from past the entries it is to remove, in a
// statement and transaction of their own, and the DELETE removes none at
// or past kept_from: a batch committed from a node's knowledge
// (changesGuardSQL) then fails on a message being removed, and the room's
// lock is held only for that UPDATE, never while rows are deleted (a
// commit holding the lock may wait on a message_state row the DELETE
// holds: one statement doing both could deadlock).
func (p *Postgres) deleteLoop(ctx context.Context, raise, del string, roomID int64, arg any) (int64, error) {
	var deleted int64
	for {
		if _, err := p.pool.Exec(ctx, raise, roomID, arg, retentionBatch); err != nil {
			return deleted, p.wrap("mark messages removed", err)
		}
		var n, deps int64
		if err := p.pool.QueryRow(ctx, del, roomID, arg, retentionBatch).Scan(&n, &deps); err != nil {
			return deleted, p.wrap("delete expired messages", err)
		}
		deleted += n + deps
		if n < retentionBatch {
			return deleted, nil
		}
	}
}
