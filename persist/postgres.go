package persist

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/roost-chat/roost/proto"
)

// PGConfig tunes the PostgreSQL store. Zero fields take their defaults.
type PGConfig struct {
	// MaxConns bounds the connection pool; default 8. The publish pool
	// needs one per worker, reads and retention share the rest.
	MaxConns int32
	// StatementTimeout is PostgreSQL's statement_timeout for every
	// statement of the store; default 5s.
	StatementTimeout time.Duration
	// ResolveTimeout bounds how long a commit whose outcome is unknown (the
	// connection died while committing) is resolved before it is reported
	// as failed; default 10s. See CommitBatch.
	ResolveTimeout time.Duration
	// MaxAppRooms bounds the rooms of one app (0: no bound): a publish or
	// join that would make one more fails with proto.ErrRoomLimit.
	MaxAppRooms int
	// Logger gets the store's rare events (ambiguous commits, retention
	// failures); default slog.Default().
	Logger *slog.Logger
}

// backendSetup runs on each new connection of the pool (pgxpool's
// AfterConnect). A variable so that a test can leave it out, to compare a
// cold backend with a warmed one.
var backendSetup = warmBackendHeap

// Postgres is the durable store on PostgreSQL (schema in migrations/). Room
// ids are cached in memory after first use, so a publish costs no lookup.
type Postgres struct {
	pool  *pgxpool.Pool
	cfg   PGConfig
	log   *slog.Logger
	rooms [memShards]roomShard
	token atomic.Uint64 // next commit-batch token (random start, see messages.batch)

	// Commits whose outcome was unknown, by how they were settled.
	resolvedCommitted, resolvedRolledBack, unresolved atomic.Uint64
	// Commit statements that failed with deadlock_detected; commit
	// statements sent again after a failure that a retry resolves.
	deadlocks, retries atomic.Uint64
	// checkUntil (Unix ns): until then batches are committed with
	// commitSQL, which looks every key up; after it with freshSQL, which
	// does not (see commitStatement). rechecks counts the freshSQL
	// statements that met a stored key and were sent again as commitSQL.
	checkUntil atomic.Int64
	rechecks   atomic.Uint64
	// kc is what the node knows of its rooms' changes (changes.go);
	// staleCommits counts the batches committed from it that found it
	// out of date.
	kc           kindsCache
	staleCommits atomic.Uint64

	policy RetentionPolicy
	// fileRetention, when not nil, is the apps' own retention from a
	// registry kept in a file, in place of the apps table's columns.
	fileRetention map[string]Retention
	ret           retentionCounters

	roomsRefused atomic.Uint64 // rooms not made: their app has MaxAppRooms
	appRoomsMu   sync.Mutex
	appRooms     map[string]*appRooms // by app: its rooms, as last counted plus those made since

	closed      atomic.Bool
	stopRetain  context.CancelFunc
	retainDone  chan struct{}
	retainMu    sync.Mutex
	scratchPool sync.Pool
	reloadApps  chan struct{} // Reload -> WatchApps
}

var _ Store = (*Postgres)(nil)

type roomShard struct {
	mu  sync.RWMutex
	ids map[string]int64
}

// OpenPostgres connects to the database at url and checks that it answers.
// It does not check the schema (SchemaCurrent) nor migrate it (Migrate).
func OpenPostgres(ctx context.Context, url string, cfg PGConfig) (*Postgres, error) {
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = 8
	}
	if cfg.StatementTimeout <= 0 {
		cfg.StatementTimeout = 5 * time.Second
	}
	if cfg.ResolveTimeout <= 0 {
		cfg.ResolveTimeout = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("cannot parse --database-url: %w", err)
	}
	pc.MaxConns = cfg.MaxConns
	pc.ConnConfig.RuntimeParams["statement_timeout"] = strconv.FormatInt(cfg.StatementTimeout.Milliseconds(), 10)
	pc.ConnConfig.RuntimeParams["application_name"] = "roost"
	// Every statement of the store is meant to run on an index. pgx
	// prepares its statements, and PostgreSQL settles on a generic plan
	// after five executions: planned while the tables were still small,
	// it would scan messages sequentially for the duplicate check and cost
	// time linear in the room's size for every later batch (measured: 13
	// µs of PostgreSQL CPU per publish at 25k rows, 125 µs at 200k).
	pc.ConnConfig.RuntimeParams["enable_seqscan"] = "off"
	// With the scans so held to indexes, a statement's generic plan is what
	// its custom plans are (arrays unnested, every scan an index's), yet
	// PostgreSQL's default (auto) kept planning the commits for their
	// parameters: perf on the backends through a node showed 15 % of their
	// CPU planning batches of changes and 5.7 % planning batches of plain
	// messages. Generic plans save that whole; the plan tests
	// (TestPostgresFoldPlan, TestCommitPlan...) check them.
	pc.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	pc.AfterConnect = backendSetup
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("cannot create PostgreSQL pool: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("cannot connect to PostgreSQL (check --database-url): %w", err)
	}
	p := &Postgres{pool: pool, cfg: cfg, log: cfg.Logger, appRooms: make(map[string]*appRooms), reloadApps: make(chan struct{}, 1)}
	for i := range p.rooms {
		p.rooms[i].ids = make(map[string]int64)
	}
	var seed [8]byte
	_, _ = crand.Read(seed[:])
	p.token.Store(binary.LittleEndian.Uint64(seed[:]))
	p.scratchPool.New = func() any {
		return &pgScratch{dedup: make(map[dedupKey]int), base: make(map[int64]uint64), count: make(map[int64]int64)}
	}
	return p, nil
}

// warmBackendHeap has a new backend allocate and free one MiB once. A
// PostgreSQL backend's memory comes from glibc's malloc, which hands back
// to the kernel whatever the top of the heap has free beyond a trim
// threshold (128 KiB at start) whenever a transaction's memory contexts are
// freed: every commit of a batch then grows the heap again (brk) and faults
// its pages in anew. A chunk of a MiB, served by mmap and freed, raises
// glibc's mmap threshold to its size and the trim threshold to twice that
// (its dynamic threshold rule), so from then on a commit's memory stays in
// the heap between commits (docs/bench-notes/2026-12-04.md, "The backend keeps its
// heap").
func warmBackendHeap(ctx context.Context, c *pgx.Conn) error {
	_, err := c.Exec(ctx, "SELECT length(repeat(repeat('x', 1024), 1024))")
	return err
}

// Close stops retention and closes the connections. In-flight calls fail.
func (p *Postgres) Close() {
	if p.closed.Swap(true) {
		return
	}
	p.retainMu.Lock()
	if p.stopRetain != nil {
		p.stopRetain()
		<-p.retainDone
	}
	p.retainMu.Unlock()
	p.pool.Close()
}

// --- room ids ---

func (p *Postgres) cachedRoom(key string) (int64, bool) {
	sh := &p.rooms[hashKey(key)%memShards]
	sh.mu.RLock()
	id, ok := sh.ids[key]
	sh.mu.RUnlock()
	return id, ok
}

func (p *Postgres) cacheRoom(key string, id int64) {
	sh := &p.rooms[hashKey(key)%memShards]
	sh.mu.Lock()
	sh.ids[key] = id
	sh.mu.Unlock()
}

// ensureRooms creates the apps and rooms of keys (all distinct, none
// cached) and caches their ids. Slow path: once per room per process. With
// MaxAppRooms, a new room of an app that has that many already is not
// made, and its key stays uncached (the caller answers proto.ErrRoomLimit);
// see boundRooms.
//
// It takes no lock on a room that exists: an upsert (ON CONFLICT DO UPDATE)
// would lock every existing row it names, in input order, and two nodes
// making overlapping rooms at once (every node after a fleet start) then
// deadlock, or deadlock with a commit that holds those rows. Existing rooms
// are read plainly; only missing ones are inserted, in one order on every
// node (COLLATE "C"), so concurrent inserts of the same new rooms wait on
// each other without a cycle; a room another node made meanwhile is read
// again by a later statement, which sees its commit.
func (p *Postgres) ensureRooms(ctx context.Context, keys []string) error {
	if p.cfg.MaxAppRooms > 0 {
		var err error
		if keys, err = p.boundRooms(ctx, keys); err != nil || len(keys) == 0 {
			return err
		}
	} else if err := p.readRooms(ctx, keys); err != nil {
		return err
	}
	var apps, names []string
	for _, k := range keys {
		if _, ok := p.cachedRoom(k); !ok {
			a, n := proto.SplitKey(k)
			apps, names = append(apps, a), append(names, n)
		}
	}
	if len(apps) == 0 {
		return nil
	}
	rows, err := p.pool.Query(ctx, `
WITH a AS (
	INSERT INTO apps (id) SELECT x FROM (SELECT DISTINCT x FROM unnest($1::text[]) AS x) d ORDER BY x COLLATE "C" ON CONFLICT DO NOTHING
)
INSERT INTO rooms (app, name)
SELECT k.app, k.name FROM unnest($1::text[], $2::text[]) AS k (app, name) ORDER BY k.app COLLATE "C", k.name COLLATE "C"
ON CONFLICT (app, name) DO NOTHING
RETURNING id, app, name`, apps, names)
	if err != nil {
		return err
	}
	if err := p.scanRooms(rows); err != nil {
		return err
	}
	for _, k := range keys {
		if _, ok := p.cachedRoom(k); !ok {
			// Made by another node while we inserted: visible now.
			return p.readRooms(ctx, keys)
		}
	}
	return nil
}

// readRooms caches the ids of the rooms of keys that exist, without locks.
func (p *Postgres) readRooms(ctx context.Context, keys []string) error {
	apps := make([]string, len(keys))
	names := make([]string, len(keys))
	for i, k := range keys {
		apps[i], names[i] = proto.SplitKey(k)
	}
	rows, err := p.pool.Query(ctx, `
SELECT r.id, r.app, r.name FROM unnest($1::text[], $2::text[]) AS k (app, name)
JOIN rooms r ON r.app = k.app AND r.name = k.name`, apps, names)
	if err != nil {
		return err
	}
	return p.scanRooms(rows)
}

func (p *Postgres) scanRooms(rows pgx.Rows) error {
	defer rows.Close()
	for rows.Next() {
		var id int64
		var app, name string
		if err := rows.Scan(&id, &app, &name); err != nil {
			return err
		}
		p.cacheRoom(proto.RoomKey(app, name), id)
	}
	return rows.Err()
}

// appRoomsTTL is how long a counted app's room count is trusted before it
// is counted again (other nodes make rooms too).
const appRoomsTTL = time.Minute

type appRooms struct {
	n       int64
	counted time.Time
}

// boundRooms caches the keys that exist already and returns those of the
// rest that their apps may still make, counting them as made. Counting an
// app's rooms is a scan of its part of the rooms index (tens of ms at
// 100,000 rooms), so it is done once per appRoomsTTL per app and node, and
// the rooms this node makes are added in between: nodes that make rooms
// within the same minute can pass the bound by those rooms.
func (p *Postgres) boundRooms(ctx context.Context, keys []string) ([]string, error) {
	if err := p.readRooms(ctx, keys); err != nil {
		return nil, err
	}
	apps := make([]string, len(keys))
	for i, k := range keys {
		apps[i], _ = proto.SplitKey(k)
	}
	var stale []string
	now := time.Now()
	p.appRoomsMu.Lock()
	for _, app := range apps {
		if c := p.appRooms[app]; (c == nil || now.Sub(c.counted) > appRoomsTTL) && !containsString(stale, app) {
			stale = append(stale, app)
		}
	}
	p.appRoomsMu.Unlock()
	if len(stale) > 0 {
		counts := make(map[string]int64, len(stale))
		rows, err := p.pool.Query(ctx, `SELECT app, count(*) FROM rooms WHERE app = ANY($1) GROUP BY app`, stale)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var app string
			var n int64
			if err := rows.Scan(&app, &n); err != nil {
				rows.Close()
				return nil, err
			}
			counts[app] = n
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
		p.appRoomsMu.Lock()
		for _, app := range stale {
			p.appRooms[app] = &appRooms{n: counts[app], counted: now}
		}
		p.appRoomsMu.Unlock()
	}
	allowed := keys[:0:0]
	p.appRoomsMu.Lock()
	defer p.appRoomsMu.Unlock()
	for i, k := range keys {
		if _, ok := p.cachedRoom(k); ok {
			continue // exists
		}
		c := p.appRooms[apps[i]]
		if c.n >= int64(p.cfg.MaxAppRooms) {
			p.roomsRefused.Add(1)
			continue
		}
		c.n++
		allowed = append(allowed, k)
	}
	return allowed, nil
}

// roomID returns the id of an existing room without creating it; ok is
// false for a room never published to.
func (p *Postgres) roomID(ctx context.Context, key string) (id int64, ok bool, err error) {
	if id, ok := p.cachedRoom(key); ok {
		return id, true, nil
	}
	app, name := proto.SplitKey(key)
	err = p.pool.QueryRow(ctx, `SELECT id FROM rooms WHERE app = $1 AND name = $2`, app, name).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, p.wrap("look up room", err)
	}
	p.cacheRoom(key, id)
	return id, true, nil
}

// --- publishing ---

// commitSQL commits one batch of distinct (room, sender, key) publishes in
// one statement, hence one round trip and one transaction:
//   - old: publishes already stored (the unique key), answered with the
//     stored seq and ts;
//   - fresh: the others, numbered per room in batch order;
//   - locked: locks the batch's rooms in id order, the one order of every
//     batch of every node. The update alone would lock them in the order
//     its join and hash aggregate produce, which changes with the batch's
//     rooms and size: two nodes' batches sharing rooms then locked them in
//     opposite orders and deadlocked (PostgreSQL breaks the cycle after
//     deadlock_timeout, a second, by failing one). LockRows sits above
//     the sort, so rows are locked in sorted order, and upd touches only
//     rows locked here, so it waits for no lock of its own;
//   - upd: ONE update per room advances last_seq by the room's count of
//     fresh publishes, so a hot room takes one row lock per batch, not per
//     message; its RETURNING gives the base of the room's new seq range;
//   - ins: inserts every fresh row with base + its rank.
//
// The result lists old publishes (kind 0: ord, seq, ts) and the rooms'
// bases (kind 1: room id, base, commit ts); the caller numbers fresh
// publishes exactly as row_number did. A concurrent writer of the same key
// (another node) makes the insert fail with a unique violation; the caller
// retries and then sees the row as old.
const commitSQL = `
WITH input AS (
	SELECT * FROM unnest($1::int8[], $2::text[], $3::bytea[], $4::bytea[], $5::int4[])
		AS t (room_id, sender, idem_key, body, ord)
), old AS (
	SELECT i.ord, m.seq, m.ts
	FROM input i JOIN messages m
		ON m.room_id = i.room_id AND m.sender = i.sender AND m.idem_key = i.idem_key
), fresh AS (
	SELECT i.*, row_number() OVER (PARTITION BY i.room_id ORDER BY i.ord) AS rn
	FROM input i
	WHERE i.ord NOT IN (SELECT ord FROM old)
), counts AS (
	SELECT room_id, count(*) AS n FROM fresh GROUP BY room_id
), locked AS MATERIALIZED (
	SELECT r.id, c.n FROM rooms r JOIN counts c ON c.room_id = r.id
	ORDER BY r.id FOR NO KEY UPDATE OF r
), upd AS (
	UPDATE rooms r SET last_seq = r.last_seq + l.n, msgs = r.msgs + l.n
	FROM locked l
	WHERE r.id = l.id
	RETURNING r.id, r.last_seq - l.n AS base, r.msgs - l.n AS mbase
), ins AS (
	INSERT INTO messages (room_id, seq, sender, idem_key, ts, body, batch, msgs)
	SELECT f.room_id, u.base + f.rn, f.sender, f.idem_key, now(), f.body, $6, u.mbase + f.rn
	FROM fresh f JOIN upd u ON u.id = f.room_id
)
SELECT 0, ord::int8, seq, ts FROM old
UNION ALL
SELECT 1, id, base, now() FROM upd`

// freshSQL commits a batch taking every publish as fresh, without
// commitSQL's lookups: a key already stored makes the insert fail with a
// unique violation, which rolls the whole statement back (seqs and rooms
// included), and the batch is sent again as commitSQL. It saves, per
// publish, the descent of the unique index that almost never finds
// anything (a stored key comes back only when a client sends a publish
// again: a lost ack, a reconnect), and what the batch's numbering costs in
// SQL: CommitBatch gives each publish its rank in its room ($5) and the
// batch's rooms in id order with their counts ($6, $7). The update takes
// the rooms as unnest gives them, so it locks them in id order, the one
// order of every batch of every node, without a lock step of its own: the
// join's outer side is either that list or rooms by its primary key, both
// in id order, and rooms is never read in its physical order
// (enable_seqscan off; TestPostgresCommitPlan checks the plan).
const freshSQL = `
WITH upd AS (
	UPDATE rooms r SET last_seq = r.last_seq + c.n, msgs = r.msgs + c.n
	FROM unnest($6::int8[], $7::int8[]) AS c (id, n)
	WHERE r.id = c.id
	RETURNING r.id, r.last_seq - c.n AS base, r.msgs - c.n AS mbase
), ins AS (
	INSERT INTO messages (room_id, seq, sender, idem_key, ts, body, batch, msgs)
	SELECT i.room_id, u.base + i.rn, i.sender, i.idem_key, now(), i.body, $8, u.mbase + i.rn
	FROM unnest($1::int8[], $2::text[], $3::bytea[], $4::bytea[], $5::int8[]) AS i (room_id, sender, idem_key, body, rn)
	JOIN upd u ON u.id = i.room_id
)
SELECT 1, id, base, now() FROM upd`

// readsCTE upserts read marks in a commit statement (CommitReads), its
// arrays at $first..$first+2: room ids, users, seqs, at most one per room
// and user. PostgreSQL runs a data-modifying CTE that nothing reads once,
// to completion, after the main query: a commit's rows are locked rooms
// first (in id order), then read positions in (room, user) order, the
// order of SaveReads too, so two nodes' commits wait on each other
// without a cycle. The room ids are not checked against rooms (a lookup
// per mark): a room deleted since its id was cached leaves at worst a row
// no room will ever read.
func readsCTE(first int) string {
	return fmt.Sprintf(`rd AS (
	INSERT INTO read_positions (room_id, user_id, seq)
	SELECT k.r, k.u, k.s FROM unnest($%d::int8[], $%d::text[], $%d::int8[]) AS k (r, u, s)
	ORDER BY k.r, k.u COLLATE "C"
	ON CONFLICT (room_id, user_id) DO UPDATE SET seq = EXCLUDED.seq WHERE read_positions.seq < EXCLUDED.seq
), `, first, first+1, first+2)
}

// freshReadsSQL and commitReadsSQL are freshSQL and commitSQL with read
// marks (readsCTE) after their own parameters.
var (
	freshReadsSQL  = withReadsCTE(freshSQL)
	commitReadsSQL = withReadsCTE(commitSQL)
	withReads      = map[string]string{freshSQL: freshReadsSQL, commitSQL: commitReadsSQL}
)

// withReadsCTE puts readsCTE first in sql's WITH, its parameters after
// the highest one sql uses.
func withReadsCTE(sql string) string {
	last := 0
	for i := strings.IndexByte(sql, '$'); i >= 0; {
		j := i + 1
		for j < len(sql) && sql[j] >= '0' && sql[j] <= '9' {
			j++
		}
		if n, err := strconv.Atoi(sql[i+1 : j]); err == nil {
			last = max(last, n)
		}
		k := strings.IndexByte(sql[j:], '$')
		if k < 0 {
			break
		}
		i = j + k
	}
	if !strings.HasPrefix(strings.TrimSpace(sql), "WITH ") {
		panic("BUG: a commit statement without WITH")
	}
	return strings.Replace(sql, "WITH ", "WITH "+readsCTE(last+1), 1)
}

// recheckFor: after a batch met a stored key, the batches of this long
// are committed with commitSQL. Keys sent again come in runs (a client
// that reconnects sends what was not acked), and each one met by
// freshSQL costs a statement that is rolled back.
const recheckFor = 2 * time.Second

// commitStatement is the statement for the next batch: freshSQL unless a
// stored key was met within recheckFor.
func (p *Postgres) commitStatement(now time.Time) string {
	if now.UnixNano() < p.checkUntil.Load() {
		return commitSQL
	}
	return freshSQL
}

// sawStored marks a stored key met at now.
func (p *Postgres) sawStored(now time.Time) {
	p.checkUntil.Store(now.Add(recheckFor).UnixNano())
}

type dedupKey struct {
	room     int64
	from, id string
}

// pgScratch is one CommitBatch's working memory, recycled across calls.
type pgScratch struct {
	ids    []int64 // per request: room id
	first  []int   // per request: index of the first request with its key
	isOld  []bool  // per request: stored before this batch
	dedup  map[dedupKey]int
	misses []string
	base   map[int64]uint64 // room id → next seq for fresh publishes
	// Distinct publishes, the statement's arrays.
	uRoom   []int64
	uSender []string
	uKey    [][]byte
	uBody   [][]byte
	uOrd    []int32
	// freshSQL's: per distinct publish its rank in its room (1, 2, ...);
	// the batch's rooms in id order and their counts.
	uRank  []int64
	rooms  []int64
	counts []int64
	count  map[int64]int64 // room id → distinct publishes so far
	// changesSQL's: per distinct publish its kind, ref, reaction text and
	// whether it may change anyone's message; changes: the batch holds a
	// change (an edit, delete, react or unreact).
	uKind   []int16
	uRef    []int64
	uText   []string
	uAny    []bool
	changes bool
	// Read marks written with the batch (CommitReads): room ids, users,
	// seqs; resolved: the commit's outcome was settled by resolve.
	rRoom    []int64
	rUser    []string
	rSeq     []int64
	resolved bool
}

func (s *pgScratch) reset(n int) {
	s.ids = resize(s.ids, n)
	clear(s.ids) // 0 marks a room not resolved yet
	s.first = resize(s.first, n)
	s.isOld = resize(s.isOld, n)
	clear(s.isOld)
	clear(s.dedup)
	clear(s.base)
	clear(s.misses)
	clear(s.uSender)
	clear(s.uKey)
	clear(s.uBody)
	s.misses = s.misses[:0]
	s.uRoom, s.uSender, s.uKey, s.uBody, s.uOrd = s.uRoom[:0], s.uSender[:0], s.uKey[:0], s.uBody[:0], s.uOrd[:0]
	s.uRank, s.rooms, s.counts = s.uRank[:0], s.rooms[:0], s.counts[:0]
	clear(s.count)
	clear(s.rUser)
	s.rRoom, s.rUser, s.rSeq, s.resolved = s.rRoom[:0], s.rUser[:0], s.rSeq[:0], false
	clear(s.uText)
	s.uKind, s.uRef, s.uText, s.uAny, s.changes = s.uKind[:0], s.uRef[:0], s.uText[:0], s.uAny[:0], false
}

func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// Statement failures that a retry resolves: a unique violation from a
// concurrent writer of the same key, and, as a safety net, a deadlock
// (commits lock rooms in one order and cannot deadlock one another).
// The statement rolled back whole, so sending it again is safe; after the
// last attempt the batch fails (overloaded) and its clients retry.
const (
	commitAttempts  = 3
	deadlockBackoff = 5 * time.Millisecond // times the attempt, before a deadlocked statement is sent again
)

// CommitBatch implements Store: one statement, one round trip, one
// transaction for the whole batch (plus one statement the first time a
// room is seen by this process).
//
// Commit-ack ambiguity: when the connection dies after the statement was
// sent (pg_terminate_backend, a network failure, a timeout), the
// transaction may or may not have committed. CommitBatch then resolves the
// outcome on another connection before answering: it locks the batch's
// rooms (waiting out the old transaction if its backend still runs it) and
// looks the batch's keys up. A row carrying this batch's token proves the
// commit: the batch is answered as a success, and the pool delivers it, so
// no subscriber sees a gap. No such row proves the rollback: proto.ErrOverloaded,
// nothing stored. Only if PostgreSQL stays unreachable for ResolveTimeout
// is the outcome unknown; the batch is then answered proto.ErrOverloaded (never an
// ack) and logged, and a retry of the same key returns the stored seq if it
// did commit.
func (p *Postgres) CommitBatch(ctx context.Context, rs []*Row) error {
	return p.CommitReads(ctx, rs, nil)
}

// CommitReads implements Reads: the marks are upserted by the commit
// statement itself (readsCTE), so they cost the batch's transaction a few
// rows and no round trip. A batch that stores nothing (every row refused
// by the room limit) saves them on their own.
func (p *Postgres) CommitReads(ctx context.Context, rs []*Row, marks []ReadMark) error {
	s := p.scratchPool.Get().(*pgScratch)
	defer func() {
		s.reset(0) // drop the references to the batch's requests
		p.scratchPool.Put(s)
	}()
	s.reset(len(rs))
	if err := p.markIDs(ctx, s, marks); err != nil {
		for _, r := range rs {
			r.Stored = Stored{Err: proto.ErrOverloaded}
		}
		return err
	}
	err := p.commit(ctx, s, rs)
	if err == nil && len(s.rRoom) > 0 && (len(s.uOrd) == 0 || s.resolved) {
		// Not written by a statement of this call that is known to have
		// run: saved apart (positions only grow, so twice is harmless).
		if err := p.saveReadIDs(ctx, s.rRoom, s.rUser, s.rSeq); err != nil {
			// The rows are stored: only the marks failed. The caller hears
			// of it and keeps them; the rows' answers stand.
			return fmt.Errorf("%w: %w", ErrReadsNotSaved, err)
		}
	}
	if err != nil {
		rerr := err
		if errors.Is(err, proto.ErrOverloaded) {
			rerr = proto.ErrOverloaded
		}
		for _, r := range rs {
			r.Stored = Stored{Err: rerr}
		}
	}
	return err
}

func (p *Postgres) commit(ctx context.Context, s *pgScratch, rs []*Row) error {
	if p.closed.Load() {
		return proto.ErrClosed
	}
	if err := p.prepare(ctx, s, rs); err != nil {
		return err
	}
	if len(s.uOrd) == 0 {
		return nil // every request was refused by the room limit
	}
	var err error
	sql := p.commitStatement(time.Now())
	if s.changes {
		sql = changesSQL
		if p.commitStatement(time.Now()) == freshSQL {
			sql = changesFreshSQL
		}
	} else if len(s.rRoom) > 0 {
		sql = withReads[sql]
	}
	for attempt := 1; ; attempt++ {
		token := int64(p.token.Add(1))
		// Acquire apart from the statement: a failure to get a connection
		// certainly sent nothing, so it needs no resolution.
		conn, aerr := p.pool.Acquire(ctx)
		if aerr != nil {
			return p.wrap("acquire connection", aerr)
		}
		err = p.runCommit(ctx, conn, sql, s, rs, token)
		conn.Release()
		if err == nil {
			break
		}
		if !pgconn.SafeToRetry(err) && !isStatementError(err) {
			return p.resolve(s, rs, token, err)
		}
		if (sql == freshSQL || sql == freshReadsSQL || sql == changesFreshSQL) && isUniqueViolation(err) {
			// A key of the batch is stored already (or being stored by
			// another node): the same batch again, looking its keys up.
			// Not an attempt of its own: commitSQL gets all of them.
			p.rechecks.Add(1)
			p.sawStored(time.Now())
			sql = commitSQL
			if s.changes {
				sql = changesSQL
			} else if len(s.rRoom) > 0 {
				sql = commitReadsSQL
			}
			attempt--
			clear(s.isOld)
			clear(s.base)
			continue
		}
		deadlock := isDeadlock(err)
		if deadlock {
			p.deadlocks.Add(1)
		}
		if attempt == commitAttempts || !isRetryable(err) {
			return p.wrap("commit batch", err)
		}
		p.retries.Add(1)
		if deadlock {
			// Sent again at once, the statement would take its first rows
			// again before the transaction it deadlocked with (woken by
			// this one's rollback) gets them, and close the same cycle.
			t := time.NewTimer(time.Duration(attempt) * deadlockBackoff)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return p.wrap("commit batch", err)
			}
		}
		clear(s.isOld)
		clear(s.base)
	}
	s.answerRepeats(rs)
	return nil
}

// prepare resolves the batch's room ids and fills the statement's arrays
// with its distinct publishes. A request whose room could not be made (the
// app's room limit) is answered here with proto.ErrRoomLimit and left out.
func (p *Postgres) prepare(ctx context.Context, s *pgScratch, rs []*Row) error {
	if err := p.resolveRooms(ctx, s, rs); err != nil {
		return err
	}
	// In-batch repeats are answered from their first request, so the
	// statement sees distinct keys only. The id strings alias req.ID, live
	// for this call only, and are cleared from the map by reset.
	for i, r := range rs {
		if s.ids[i] == 0 {
			s.first[i] = i
			r.Stored = Stored{Err: proto.ErrRoomLimit}
			continue
		}
		var text string
		if r.Kind.IsReaction() {
			t, ok := proto.ReactionText(nil, r.Body)
			if !ok { // the edges check it: never stored
				s.first[i] = i
				r.Stored = Stored{Err: proto.ErrBadReaction}
				continue
			}
			text = string(t)
		}
		k := dedupKey{s.ids[i], r.From, unsafe.String(unsafe.SliceData(r.ID), len(r.ID))}
		if f, ok := s.dedup[k]; ok {
			s.first[i] = f
			continue
		}
		s.dedup[k] = i
		s.first[i] = i
		s.uRoom = append(s.uRoom, s.ids[i])
		s.uSender = append(s.uSender, r.From)
		s.uKey = append(s.uKey, r.ID)
		s.uBody = append(s.uBody, r.Body)
		s.uOrd = append(s.uOrd, int32(i))
		s.changes = s.changes || r.Kind != proto.KindMsg
		s.uKind = append(s.uKind, int16(r.Kind))
		s.uRef = append(s.uRef, clampSeq(r.Ref))
		s.uText = append(s.uText, text)
		s.uAny = append(s.uAny, r.Any)
		n := s.count[s.ids[i]] + 1
		s.count[s.ids[i]] = n
		s.uRank = append(s.uRank, n)
	}
	for room := range s.count {
		s.rooms = append(s.rooms, room)
	}
	slices.Sort(s.rooms)
	for _, room := range s.rooms {
		s.counts = append(s.counts, s.count[room])
	}
	return nil
}

// resolveRooms fills s.ids, creating the rooms not cached yet; a room the
// app's limit did not let be made keeps id 0.
func (p *Postgres) resolveRooms(ctx context.Context, s *pgScratch, rs []*Row) error {
	for i, r := range rs {
		id, ok := p.cachedRoom(r.Key)
		if !ok {
			if !containsString(s.misses, r.Key) {
				s.misses = append(s.misses, r.Key)
			}
			continue
		}
		s.ids[i] = id
	}
	if len(s.misses) == 0 {
		return nil
	}
	if err := p.ensureRooms(ctx, s.misses); err != nil {
		return p.wrap("create rooms", err)
	}
	for i, r := range rs {
		if s.ids[i] == 0 {
			s.ids[i], _ = p.cachedRoom(r.Key)
		}
	}
	return nil
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// runCommit executes sql (commitSQL or freshSQL) and fills res for the
// distinct publishes.
func (p *Postgres) runCommit(ctx context.Context, conn *pgxpool.Conn, sql string, s *pgScratch, rs []*Row, token int64) error {
	var rows pgx.Rows
	var err error
	if sql == changesSQL || sql == changesFreshSQL {
		return p.runChanges(ctx, conn, s, rs, token, sql == changesSQL)
	}
	var args []any
	if sql == freshSQL || sql == freshReadsSQL {
		args = []any{s.uRoom, s.uSender, s.uKey, s.uBody, s.uRank, s.rooms, s.counts, token}
	} else {
		args = []any{s.uRoom, s.uSender, s.uKey, s.uBody, s.uOrd, token}
	}
	if sql == freshReadsSQL || sql == commitReadsSQL {
		// readsCTE's arrays follow the statement's own parameters.
		args = append(args, s.rRoom, s.rUser, s.rSeq)
	}
	rows, err = conn.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	freshTS, old, err := p.readCommit(rows, s, rs)
	if err != nil {
		return err
	}
	if old {
		p.sawStored(time.Now())
	}
	ext := p.kc.extending(s)
	for _, ord := range s.uOrd {
		if s.isOld[ord] {
			continue
		}
		room := s.ids[ord]
		base, ok := s.base[room]
		if !ok {
			return fmt.Errorf("cannot commit batch: BUG: no seq range for room %d", room)
		}
		base++
		s.base[room] = base
		rs[ord].Stored = Stored{Seq: base, TS: freshTS}
		if ext != nil {
			ext.add(room, base, rs[ord].From, freshTS)
		}
	}
	if ext != nil {
		p.kc.extend(ext)
	}
	return nil
}

// changesSQL stands for the commit of a batch holding changes (edits,
// deletes, reactions): runChanges (changes.go). Batches of messages alone
// keep commitSQL and freshSQL.
const changesSQL = "changes"

// changesFreshSQL is changesSQL taking the batch's keys as new, as
// freshSQL does for messages (changes.go).
const changesFreshSQL = "changes, fresh"

// readCommit reads the commit statement's answer (old reports stored keys
// met); rows.Err after Close reports a failure up to the end of the
// statement, its commit included.
func (p *Postgres) readCommit(rows pgx.Rows, s *pgScratch, rs []*Row) (freshTS int64, old bool, err error) {
	defer rows.Close()
	for rows.Next() {
		var kind int32
		var a, b int64
		var ts time.Time
		if err := rows.Scan(&kind, &a, &b, &ts); err != nil {
			return 0, false, err
		}
		if kind == 0 {
			rs[a].Stored = Stored{Seq: uint64(b), TS: ts.UnixMilli(), Duplicate: true}
			s.isOld[a] = true
			old = true
		} else {
			s.base[a] = uint64(b)
			freshTS = ts.UnixMilli()
		}
	}
	rows.Close()
	return freshTS, old, rows.Err()
}

// resolve settles a commit whose outcome is unknown (see CommitBatch).
func (p *Postgres) resolve(s *pgScratch, rs []*Row, token int64, cause error) error {
	deadline := time.Now().Add(p.cfg.ResolveTimeout)
	backoff := 10 * time.Millisecond
	for {
		committed, err := p.resolveOnce(s, rs, token, deadline)
		if err == nil {
			if !committed {
				p.resolvedRolledBack.Add(1)
				return p.wrap("commit batch (rolled back)", cause)
			}
			p.resolvedCommitted.Add(1)
			s.resolved = true
			p.log.Info("persist: commit outcome resolved after a connection failure",
				"requests", len(rs), "cause", cause)
			s.answerRepeats(rs)
			return nil
		}
		if p.closed.Load() || time.Now().Add(backoff).After(deadline) {
			p.unresolved.Add(1)
			p.log.Error("persist: commit outcome unknown: answered overloaded; a retry of the same keys returns the stored seq if it committed",
				"requests", len(rs), "cause", cause, "err", err)
			return p.wrap("commit batch (outcome unknown)", cause)
		}
		time.Sleep(backoff)
		backoff = min(2*backoff, time.Second)
	}
}

// resolveOnce reports whether the batch with token committed and, if so,
// fills res for its distinct publishes.
func (p *Postgres) resolveOnce(s *pgScratch, rs []*Row, token int64, deadline time.Time) (bool, error) {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read-only; the rollback only releases locks
	// The lock waits for the in-doubt transaction if its backend still
	// runs it, so the lookup below sees its final outcome.
	if _, err := tx.Exec(ctx, `SELECT 1 FROM rooms WHERE id = ANY($1) ORDER BY id FOR UPDATE`, s.uRoom); err != nil {
		return false, err
	}
	rows, err := tx.Query(ctx, `
SELECT i.ord, m.seq, m.ts, m.batch
FROM unnest($1::int8[], $2::text[], $3::bytea[], $4::int4[]) AS i (room_id, sender, idem_key, ord)
JOIN messages m ON m.room_id = i.room_id AND m.sender = i.sender AND m.idem_key = i.idem_key`,
		s.uRoom, s.uSender, s.uKey, s.uOrd)
	if err != nil {
		return false, err
	}
	clear(s.isOld)
	if s.changes {
		for _, ord := range s.uOrd {
			rs[ord].Stored = Stored{} // what a failed read of the answer left
		}
	}
	found, ours := 0, 0
	for rows.Next() {
		var ord int32
		var seq, batch int64
		var ts time.Time
		if err := rows.Scan(&ord, &seq, &ts, &batch); err != nil {
			rows.Close()
			return false, err
		}
		found++
		rs[ord].Stored = Stored{Seq: uint64(seq), TS: ts.UnixMilli(), Duplicate: batch != token}
		if batch == token {
			ours++
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return false, err
	}
	if s.changes {
		// A change may store nothing and still be answered (a standing
		// reaction, a bad ref): a row of this batch proves the commit, and
		// the publishes without one are answered overloaded, so their
		// clients send them again and get the answer the rules give.
		if ours == 0 {
			for _, ord := range s.uOrd {
				rs[ord].Stored = Stored{}
			}
			return false, nil
		}
		for _, ord := range s.uOrd {
			if rs[ord].Seq == 0 {
				rs[ord].Stored = Stored{Err: proto.ErrOverloaded}
			}
		}
		return true, nil
	}
	// Committed: every distinct publish has a row (new ones carry the
	// token). Not committed but every key was stored before: all are
	// duplicates, which is the truth either way.
	if found == len(s.uOrd) {
		return true, nil
	}
	if ours > 0 {
		return false, fmt.Errorf("BUG: batch %d committed but %d of %d keys have no row", token, len(s.uOrd)-found, len(s.uOrd))
	}
	for _, ord := range s.uOrd {
		rs[ord].Stored = Stored{}
	}
	return false, nil
}

// answerRepeats answers each in-batch repeat of a key from its first
// occurrence, as a duplicate.
func (s *pgScratch) answerRepeats(rs []*Row) {
	for i, r := range rs {
		if f := s.first[i]; f != i {
			r.Stored = rs[f].Stored
			r.Duplicate = true
		}
	}
}

// CommitStats counts the commit statements PostgreSQL failed on their
// own and CommitBatch sent again, and the commits whose outcome was
// unknown after a connection failure, by how they were settled.
type CommitStats struct {
	// Deadlocks: commit statements PostgreSQL failed with
	// deadlock_detected. Batches lock their rooms in one order (see
	// commitSQL), so any deadlock means something else holds room locks.
	Deadlocks uint64
	// Retries: commit statements sent again after a deadlock, a
	// serialization failure or a unique violation (another node storing the
	// same key at once), at most commitAttempts in all per batch.
	Retries uint64
	// Rechecks: batches committed without looking their keys up that met
	// a stored key and were sent again looking them up (see freshSQL).
	Rechecks uint64
	// Stale: batches of changes committed from the node's knowledge of
	// their rooms that found it out of date (another node wrote to the
	// room, or retention removed a message named) and were committed
	// again the long way (see runChanges).
	Stale                                             uint64
	ResolvedCommitted, ResolvedRolledBack, Unresolved uint64
}

// CommitStats returns the store's commit counters; it takes no lock.
func (p *Postgres) CommitStats() CommitStats {
	return CommitStats{
		Deadlocks: p.deadlocks.Load(), Retries: p.retries.Load(), Rechecks: p.rechecks.Load(), Stale: p.staleCommits.Load(),
		ResolvedCommitted: p.resolvedCommitted.Load(), ResolvedRolledBack: p.resolvedRolledBack.Load(), Unresolved: p.unresolved.Load(),
	}
}

// RoomsRefused counts rooms not made because their app had MaxAppRooms.
func (p *Postgres) RoomsRefused() uint64 { return p.roomsRefused.Load() }

// --- reads ---

// LastSeq implements Store.
func (p *Postgres) LastSeq(ctx context.Context, key string) (uint64, error) {
	id, ok, err := p.roomID(ctx, key)
	if err != nil || !ok {
		return 0, err
	}
	var last int64
	if err := p.pool.QueryRow(ctx, `SELECT last_seq FROM rooms WHERE id = $1`, id).Scan(&last); err != nil {
		return 0, p.wrap("read last seq", err)
	}
	return uint64(last), nil
}

// storedRooms returns the ids of the rooms of keys that exist, ids[j]
// being the room keys[at[j]]: from the node's cache, those not cached yet
// read in one query (readRooms, as commits do).
func (p *Postgres) storedRooms(ctx context.Context, keys []string) (ids []int64, at []int, err error) {
	var missing []string
	for _, k := range keys {
		if _, ok := p.cachedRoom(k); !ok {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		if err := p.readRooms(ctx, missing); err != nil {
			return nil, nil, p.wrap("look up rooms", err)
		}
	}
	ids, at = make([]int64, 0, len(keys)), make([]int, 0, len(keys))
	for i, k := range keys {
		if id, ok := p.cachedRoom(k); ok {
			ids, at = append(ids, id), append(at, i)
		}
	}
	return ids, at, nil
}

// LastSeqs implements Store: the rooms' ids (storedRooms), then one query
// by id; a room that does not exist is 0.
func (p *Postgres) LastSeqs(ctx context.Context, keys []string, last []uint64) error {
	clear(last)
	ids, at, err := p.storedRooms(ctx, keys)
	if err != nil {
		return err
	}
	if len(ids) == 0 {
		return nil
	}
	return p.queryByOrdinal(ctx, "read last seqs", func(i int, l int64) { last[at[i]] = uint64(l) }, lastSeqsSQL, ids)
}

// queryByOrdinal runs a query whose rows are (ordinal from 1 of the
// input arrays, value), as lastSeqsSQL's and readPositionsOfSQL's, and
// gives each to set with the ordinal from 0.
func (p *Postgres) queryByOrdinal(ctx context.Context, what string, set func(i int, v int64), sql string, args ...any) error {
	rows, err := p.pool.Query(ctx, sql, args...)
	if err != nil {
		return p.wrap(what, err)
	}
	defer rows.Close()
	for rows.Next() {
		var j, v int64
		if err := rows.Scan(&j, &v); err != nil {
			return p.wrap(what, err)
		}
		set(int(j-1), v)
	}
	if err := rows.Err(); err != nil {
		return p.wrap(what, err)
	}
	return nil
}

// lastSeqsSQL probes rooms_pkey once per id (a LIMIT 1 lateral, as
// unreadSQL's, so that a generic plan cannot turn it into a scan of rooms).
const lastSeqsSQL = `
SELECT k.i, r.last_seq FROM unnest($1::int8[]) WITH ORDINALITY AS k (id, i)
JOIN LATERAL (SELECT r.last_seq FROM rooms r WHERE r.id = k.id LIMIT 1) r ON true`

// Head implements Store: the room is created here if it does not exist
// yet, so that its epoch is fixed before its first message.
func (p *Postgres) Head(ctx context.Context, key string) (Head, error) {
	if p.closed.Load() {
		return Head{}, proto.ErrClosed
	}
	id, ok := p.cachedRoom(key)
	if !ok {
		if err := p.ensureRooms(ctx, []string{key}); err != nil {
			return Head{}, p.wrap("create room", err)
		}
		if id, ok = p.cachedRoom(key); !ok {
			return Head{}, proto.ErrRoomLimit
		}
	}
	var h Head
	var last int64
	if err := p.pool.QueryRow(ctx, `SELECT last_seq, epoch FROM rooms WHERE id = $1`, id).Scan(&last, &h.Epoch); err != nil {
		return Head{}, p.wrap("read room head", err)
	}
	h.Last = uint64(last)
	return h, nil
}

// boundedSQL reads one page of a room within Bounds in one index scan. fits
// marks the rows inside the limit ($4) that, with the rows before them, stay
// within the byte bound ($5; each row counts its id, sender and body plus
// $6, as MsgSize does). The first row always fits: one message too big for
// a page is still read. The first row that does not fit is returned too,
// without its body, to tell that the read stopped early; the rows after it
// are not. ORDER is the scan direction.
const boundedSQL = `
SELECT seq, idem_key, sender, ts, CASE WHEN fits THEN body END, fits, kind, coalesce(ref, 0) FROM (
	SELECT *, lag(fits, 1, true) OVER (ORDER BY seq ORDER_DIR) AS prev_fits FROM (
		SELECT seq, idem_key, sender, ts, body, kind, ref,
			row_number() OVER w <= $4 AND ($5 <= 0 OR row_number() OVER w = 1 OR
				sum(octet_length(body) + octet_length(idem_key) + octet_length(sender) + $6) OVER (w ROWS UNBOUNDED PRECEDING) <= $5) AS fits
		FROM messages WHERE room_id = $1 AND seq > $2 AND seq <= $3
		WINDOW w AS (ORDER BY seq ORDER_DIR)
		ORDER BY seq ORDER_DIR LIMIT $4 + 1
	) a
) b WHERE prev_fits ORDER BY seq ORDER_DIR`

var (
	rangeSQL   = strings.ReplaceAll(boundedSQL, "ORDER_DIR", "")
	historySQL = strings.ReplaceAll(boundedSQL, "ORDER_DIR", "DESC")
)

// Range implements Store (primary key range scan).
func (p *Postgres) Range(ctx context.Context, key string, after, upto uint64, b Bounds) ([]proto.Message, bool, error) {
	if b.Limit <= 0 || upto <= after {
		return nil, false, nil
	}
	id, ok, err := p.roomID(ctx, key)
	if err != nil || !ok {
		return nil, false, err
	}
	_, name := proto.SplitKey(key)
	rows, err := p.pool.Query(ctx, rangeSQL, id, clampSeq(after), clampSeq(upto), b.Limit, b.MaxBytes, msgOverhead+len(name))
	if err != nil {
		return nil, false, p.wrap("read range", err)
	}
	msgs, more, err := scanMessages(rows, name, min(b.Limit, int(min(upto-after, 1024))))
	if err != nil {
		return nil, false, p.wrap("read range", err)
	}
	return msgs, more, nil
}

// History implements Store (primary key backward scan).
func (p *Postgres) History(ctx context.Context, key string, before uint64, b Bounds) ([]proto.Message, bool, error) {
	if b.Limit <= 0 {
		return nil, false, nil
	}
	id, ok, err := p.roomID(ctx, key)
	if err != nil || !ok {
		return nil, false, err
	}
	upto := uint64(math.MaxInt64)
	if before != 0 {
		if before <= 1 {
			return nil, false, nil
		}
		upto = before - 1
	}
	_, name := proto.SplitKey(key)
	rows, err := p.pool.Query(ctx, historySQL, id, int64(0), clampSeq(upto), b.Limit, b.MaxBytes, msgOverhead+len(name))
	if err != nil {
		return nil, false, p.wrap("read history", err)
	}
	msgs, more, err := scanMessages(rows, name, min(b.Limit, 1024))
	if err != nil {
		return nil, false, p.wrap("read history", err)
	}
	for i, j := 0, len(msgs)-1; i < j; i, j = i+1, j-1 {
		msgs[i], msgs[j] = msgs[j], msgs[i]
	}
	return msgs, more, nil
}

// RetentionStats implements Store.
func (p *Postgres) RetentionStats() RetentionStats { return p.ret.stats() }

func clampSeq(s uint64) int64 { return int64(min(s, math.MaxInt64)) }

// scanMessages reads the rows of boundedSQL; a row that did not fit ends
// the page and reports more.
func scanMessages(rows pgx.Rows, name string, capHint int) ([]proto.Message, bool, error) {
	defer rows.Close()
	msgs := make([]proto.Message, 0, capHint)
	more := false
	for rows.Next() {
		var seq int64
		var id, body []byte
		var from string
		var ts time.Time
		var fits bool
		var kind int16
		var ref int64
		if err := rows.Scan(&seq, &id, &from, &ts, &body, &fits, &kind, &ref); err != nil {
			return nil, false, err
		}
		if !fits {
			more = true
			continue
		}
		msgs = append(msgs, proto.Message{Room: name, Seq: uint64(seq), ID: string(id), From: from, TS: ts.UnixMilli(), Body: body,
			Kind: proto.Kind(kind), Ref: uint64(ref)})
	}
	return msgs, more, rows.Err()
}

// --- errors ---

// wrap maps connectivity failures to proto.ErrOverloaded (the client gets `err`
// `overloaded` and may retry) and keeps others as internal errors.
func (p *Postgres) wrap(what string, err error) error {
	if isConnError(err) {
		return fmt.Errorf("cannot %s: %w: %w", what, proto.ErrOverloaded, err)
	}
	return fmt.Errorf("cannot %s: %w", what, err)
}

// isStatementError reports an error of the statement itself (severity
// ERROR): its transaction rolled back and the session goes on, so the
// outcome is certain. FATAL and PANIC end the session, maybe after COMMIT.
func isStatementError(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Severity == "ERROR"
}

func isRetryable(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	switch pe.Code {
	case "23505", "40001", "40P01": // unique_violation, serialization_failure, deadlock_detected
		return true
	}
	return false
}

func isUniqueViolation(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505"
}

func isDivisionByZero(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "22012"
}

func isDeadlock(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "40P01"
}

// isConnError reports failures of reaching PostgreSQL rather than of the
// statement: no connection, a terminated or broken one, a timeout,
// PostgreSQL shutting down or out of connections.
func isConnError(err error) bool {
	if errors.Is(err, proto.ErrOverloaded) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, context.Canceled) || pgconn.Timeout(err) {
		return true
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return strings.HasPrefix(pe.Code, "08") || // connection_exception
			strings.HasPrefix(pe.Code, "53") || // insufficient_resources, too_many_connections
			strings.HasPrefix(pe.Code, "57") || // operator_intervention: admin_shutdown, query_canceled (statement_timeout), cannot_connect_now
			pe.Code == "40001" || pe.Code == "40P01"
	}
	// Anything else pgx reports without a server error is a dial, I/O or
	// closed-connection failure.
	return true
}
