package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"math"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The admin page (GET / on the admin listener): this node and every node
// of the cluster, live. Its numbers are the node's own /metrics, sampled
// once a second while someone watches, so the page never says what the
// metrics do not; the busiest rooms come from the hub's per-room message
// counts. With Redis each watched node shares its status (pubsub
// ShareStatus) and the page shows them all; without, this node alone. A
// node nobody watches samples nothing: it only looks every
// statusIdleEvery for the cluster's watch mark.

const (
	statusEvery     = time.Second
	statusIdleEvery = 5 * time.Second
	statusWatchTTL  = 30 * time.Second // a page's poll keeps the nodes sampling this long
	statusHistory   = 120              // samples kept for the page's charts
	statusTopRooms  = 10
)

// nodeStatus is one node's sample, as the page reads it (GET /admin/status).
type nodeStatus struct {
	Node        string  `json:"node"`
	Version     string  `json:"version"`
	TS          int64   `json:"ts"` // Unix ms of the sample
	Uptime      float64 `json:"uptime_s"`
	Loops       int     `json:"loops"`
	Conns       float64 `json:"conns"`
	SSE         float64 `json:"sse"`
	Rooms       float64 `json:"rooms"`
	Memberships float64 `json:"memberships"`
	RSS         float64 `json:"rss_bytes"`
	Pubs        float64 `json:"publishes_per_s"`
	Frames      float64 `json:"frames_per_s"`
	AckP50      float64 `json:"ack_p50_ms"` // over the last second; -1 without acks
	AckP99      float64 `json:"ack_p99_ms"`
	WebhookOwed float64 `json:"webhook_owed"`
	WebhookLag  float64 `json:"webhook_lag_p99_ms"` // -1 without deliveries
	// Per-app webhook series of /metrics (owed, dropped, ...), app → name → value.
	Webhooks map[string]map[string]float64 `json:"webhooks"`
	Busiest  []roomRate                    `json:"busiest_rooms"`
	Limits   []limitHit                    `json:"limit_hits"`
	History  statusSeries                  `json:"history"`
}

type roomRate struct {
	Room  string  `json:"room"` // app/room
	Rate  float64 `json:"per_s"`
	Total uint64  `json:"total"`
}

type limitHit struct {
	Series string  `json:"series"` // as in /metrics, labels included
	Rate   float64 `json:"per_s"`
	Total  float64 `json:"total"`
}

type statusSeries struct {
	TS     []int64   `json:"ts"`
	Pubs   []float64 `json:"publishes_per_s"`
	Frames []float64 `json:"frames_per_s"`
	Conns  []float64 `json:"conns"`
	AckP99 []float64 `json:"ack_p99_ms"`
}

// statusBoard samples the node and keeps the cluster's statuses. One
// goroutine (run) owns the sampling; the handlers read under mu.
type statusBoard struct {
	a        *admin
	instance string // this process among nodes that may share a node id
	log      *slog.Logger
	started  time.Time
	watched  atomic.Int64 // Unix ns of the last local page poll
	wake     chan struct{}

	// run's own, between samples
	prevAt    time.Time
	prev      map[string]float64
	prevRooms map[string]uint64

	mu     sync.Mutex
	self   nodeStatus
	others [][]byte // other nodes' statuses, as shared
}

func newStatusBoard(a *admin, log *slog.Logger) *statusBoard {
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	return &statusBoard{a: a, log: log, instance: a.srv.NodeID() + "/" + hex.EncodeToString(rnd[:]), started: time.Now(), wake: make(chan struct{}, 1)}
}

// run samples every statusEvery while the page is watched here or, with
// Redis, anywhere in the cluster; otherwise it sleeps, looking for the
// cluster's watch mark every statusIdleEvery. It returns with ctx.
func (b *statusBoard) run(ctx context.Context) {
	t := time.NewTimer(statusIdleEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-b.wake:
		}
		if b.watchedHere() || b.watchedElsewhere(ctx) {
			b.sample(ctx)
			t.Reset(statusEvery)
		} else {
			b.prev = nil // a rate across a sleep would be stale
			t.Reset(statusIdleEvery)
		}
	}
}

func (b *statusBoard) watchedHere() bool {
	return time.Since(time.Unix(0, b.watched.Load())) < statusWatchTTL
}

func (b *statusBoard) watchedElsewhere(ctx context.Context) bool {
	if b.a.redis == nil {
		return false
	}
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	ok, err := b.a.redis.Watched(cctx)
	return err == nil && ok
}

// poll marks the page watched on this node and in the cluster, and wakes
// run for its first sample. Any goroutine.
func (b *statusBoard) poll(ctx context.Context) {
	now := time.Now()
	last := b.watched.Swap(now.UnixNano())
	if now.Sub(time.Unix(0, last)) < statusWatchTTL/3 {
		return
	}
	select {
	case b.wake <- struct{}{}:
	default:
	}
	if b.a.redis != nil {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if err := b.a.redis.Watch(cctx, statusWatchTTL); err != nil {
			b.log.Warn("admin page: cannot mark the cluster watched", "err", err)
		}
	}
}

// sample reads the node's metrics, turns counters into rates over the
// time since the last sample, and shares the result.
func (b *statusBoard) sample(ctx context.Context) {
	var buf bytes.Buffer
	if err := writeMetrics(&buf, b.a); err != nil {
		return
	}
	now := time.Now()
	cur := parseMetrics(buf.Bytes())
	rooms := map[string]uint64{}
	b.a.fan.RoomActivity(func(key string, msgs uint64) { rooms[key] = msgs })

	st := nodeStatus{
		Node: b.a.srv.NodeID(), Version: version, TS: now.UnixMilli(),
		Uptime: now.Sub(b.started).Seconds(), Loops: b.a.srv.Snapshot().Loops,
		Conns: cur["roost_connections_total_open"], SSE: cur["roost_sse_connections_open"],
		Rooms: cur["roost_rooms"], Memberships: cur["roost_room_memberships"],
		RSS: rss(), WebhookOwed: cur["roost_webhook_owed"],
		AckP50: -1, AckP99: -1, WebhookLag: -1,
		Webhooks: map[string]map[string]float64{},
	}
	for series, v := range cur {
		if app, name, ok := appSeries(series, "roost_webhook_"); ok {
			if st.Webhooks[app] == nil {
				st.Webhooks[app] = map[string]float64{}
			}
			st.Webhooks[app][name] = v
		}
	}
	if b.prev != nil {
		dt := now.Sub(b.prevAt).Seconds()
		d := func(name string) float64 { return math.Max(0, cur[name]-b.prev[name]) }
		st.Pubs = (d("roost_publishes_total") + d("roost_api_published_total")) / dt
		st.Frames = d("roost_frames_out_total") / dt
		st.AckP50 = quantile(cur, b.prev, "roost_ack_latency_seconds", 0.5) * 1000
		st.AckP99 = quantile(cur, b.prev, "roost_ack_latency_seconds", 0.99) * 1000
		st.WebhookLag = quantile(cur, b.prev, "roost_webhook_lag_seconds", 0.99) * 1000
		for series, v := range cur {
			if !isLimitSeries(series) || v == 0 {
				continue
			}
			st.Limits = append(st.Limits, limitHit{Series: series, Rate: math.Max(0, v-b.prev[series]) / dt, Total: v})
		}
		sort.Slice(st.Limits, func(i, j int) bool {
			if st.Limits[i].Rate != st.Limits[j].Rate {
				return st.Limits[i].Rate > st.Limits[j].Rate
			}
			return st.Limits[i].Series < st.Limits[j].Series
		})
		for key, n := range rooms {
			if p, ok := b.prevRooms[key]; ok && n > p {
				st.Busiest = append(st.Busiest, roomRate{Room: key, Rate: float64(n-p) / dt, Total: n})
			}
		}
		sort.Slice(st.Busiest, func(i, j int) bool {
			if st.Busiest[i].Rate != st.Busiest[j].Rate {
				return st.Busiest[i].Rate > st.Busiest[j].Rate
			}
			return st.Busiest[i].Room < st.Busiest[j].Room
		})
		if len(st.Busiest) > statusTopRooms {
			st.Busiest = st.Busiest[:statusTopRooms]
		}
	}
	b.prev, b.prevAt, b.prevRooms = cur, now, rooms

	b.mu.Lock()
	h := b.self.History
	h.TS = keepLast(append(h.TS, st.TS))
	h.Pubs = keepLast(append(h.Pubs, st.Pubs))
	h.Frames = keepLast(append(h.Frames, st.Frames))
	h.Conns = keepLast(append(h.Conns, st.Conns))
	h.AckP99 = keepLast(append(h.AckP99, st.AckP99))
	st.History = h
	b.self = st
	b.mu.Unlock()

	if b.a.redis == nil {
		return
	}
	doc, err := json.Marshal(st)
	if err != nil {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	others, err := b.a.redis.ShareStatus(cctx, b.instance, doc, 3*statusEvery)
	if err != nil {
		b.log.Warn("admin page: cannot share the node's status", "err", err)
		return
	}
	b.mu.Lock()
	b.others = others
	b.mu.Unlock()
}

func keepLast[T any](s []T) []T {
	if len(s) > statusHistory {
		return s[len(s)-statusHistory:]
	}
	return s
}

// serveStatus answers the page's poll: this node's status first, then the
// other nodes' as they shared them.
func (b *statusBoard) serveStatus(w http.ResponseWriter, r *http.Request) {
	b.poll(r.Context())
	b.mu.Lock()
	self, err := json.Marshal(b.self)
	others := b.others
	b.mu.Unlock()
	if err != nil {
		http.Error(w, "cannot encode the status: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	var out bytes.Buffer
	out.WriteString(`{"self":`)
	out.Write(self)
	out.WriteString(`,"nodes":[`)
	out.Write(self)
	for _, o := range others {
		if json.Valid(o) {
			out.WriteByte(',')
			out.Write(o)
		}
	}
	out.WriteString("]}")
	_, _ = w.Write(out.Bytes())
}

func (b *statusBoard) servePage(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/" {
		http.NotFound(w, r)
		return
	}
	b.poll(r.Context())
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	// The page fetches nothing from elsewhere: its script and style are
	// inline, and the policy says so to the browser too.
	w.Header().Set("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(adminPage)
}

// parseMetrics reads the Prometheus text format into series → value.
func parseMetrics(text []byte) map[string]float64 {
	m := make(map[string]float64, 512)
	sc := bufio.NewScanner(bytes.NewReader(text))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i <= 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		m[line[:i]] = v
	}
	return m
}

// quantile estimates the q-quantile of a histogram's observations between
// two samples, interpolating inside the bucket it falls in; -1 with none.
func quantile(cur, prev map[string]float64, name string, q float64) float64 {
	type bucket struct{ le, n float64 }
	var bs []bucket
	prefix := name + `_bucket{le="`
	for series, v := range cur {
		if !strings.HasPrefix(series, prefix) {
			continue
		}
		le := math.Inf(1)
		if s := strings.TrimSuffix(series[len(prefix):], `"}`); s != "+Inf" {
			f, err := strconv.ParseFloat(s, 64)
			if err != nil {
				continue
			}
			le = f
		}
		bs = append(bs, bucket{le, v - prev[series]})
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].le < bs[j].le })
	if len(bs) == 0 || bs[len(bs)-1].n <= 0 {
		return -1
	}
	target := q * bs[len(bs)-1].n
	lo, below := 0.0, 0.0
	for _, b := range bs {
		if b.n >= target {
			if math.IsInf(b.le, 1) {
				return lo // beyond the last bound: say the bound
			}
			if b.n == below {
				return b.le
			}
			return lo + (b.le-lo)*(target-below)/(b.n-below)
		}
		lo, below = b.le, b.n
	}
	return lo
}

// appSeries splits `prefixNAME{app="A"...}` into A and NAME.
func appSeries(series, prefix string) (app, name string, ok bool) {
	if !strings.HasPrefix(series, prefix) {
		return "", "", false
	}
	i := strings.IndexByte(series, '{')
	j := strings.Index(series, `app="`)
	if i < 0 || j < 0 {
		return "", "", false
	}
	rest := series[j+5:]
	k := strings.IndexByte(rest, '"')
	if k < 0 {
		return "", "", false
	}
	name = series[len(prefix):i]
	if labels := series[i+1 : len(series)-1]; strings.Contains(labels, ",") {
		// other labels too (e.g. a reason): keep them in the name
		name += "{" + strings.Replace(strings.Replace(labels, `app="`+rest[:k]+`"`, "", 1), ",,", ",", 1) + "}"
		name = strings.Replace(strings.Replace(name, "{,", "{", 1), ",}", "}", 1)
	}
	return rest[:k], name, true
}

// isLimitSeries picks the counters of refusals: limits hit, overload,
// sheds, slow consumers.
func isLimitSeries(series string) bool {
	name := series
	if i := strings.IndexByte(series, '{'); i >= 0 {
		name = series[:i]
	}
	if !strings.HasSuffix(name, "_total") {
		return false
	}
	for _, w := range []string{"refus", "limit", "overloaded", "shed", "slow_consumer", "rejected", "inbox_full"} {
		if strings.Contains(name, w) {
			return true
		}
	}
	return false
}

// rss is the process's resident set from /proc (0 where there is none).
func rss() float64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	pages, err := strconv.ParseFloat(f[1], 64)
	if err != nil {
		return 0
	}
	return pages * float64(os.Getpagesize())
}
