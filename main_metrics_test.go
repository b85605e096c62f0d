package main

import (
	"bufio"
	"fmt"
	"math"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/roost-chat/roost/persist/pgtest"
	"github.com/roost-chat/roost/pubsub/redistest"
)

// exposedMetrics is every series name /metrics exposes (with Redis, the
// memory store, one connection): dashboards and alerts are written
// against them, so a rename or a loss fails here.
var exposedMetrics = []string{
	// The metrics library's standard series (a sample of them).
	"go_gc_duration_seconds",
	"go_memstats_alloc_bytes",
	"go_threads",
	"process_cpu_seconds_total",
	"process_open_fds",
	"process_resident_memory_bytes",
	"go_goroutines",
	"go_heap_objects_bytes",
	"go_memory_total_bytes",
	"roost_accepted_total",
	"roost_app_refusals_total",
	"roost_app_remote_connections",
	"roost_ack_latency_seconds_bucket",
	"roost_ack_latency_seconds_count",
	"roost_ack_latency_seconds_sum",
	"roost_ack_phase_seconds_bucket",
	"roost_ack_phase_seconds_count",
	"roost_ack_phase_seconds_sum",
	"roost_unread_phase_seconds_bucket",
	"roost_unread_phase_seconds_count",
	"roost_unread_phase_seconds_sum",
	"roost_receipts_phase_seconds_bucket",
	"roost_receipts_phase_seconds_count",
	"roost_receipts_phase_seconds_sum",
	"roost_acks_total",
	"roost_broker_delivery_lag_seconds_bucket",
	"roost_broker_delivery_lag_seconds_count",
	"roost_broker_delivery_lag_seconds_sum",
	"roost_broker_dropped_total",
	"roost_broker_errors_total",
	"roost_broker_publish_seconds_bucket",
	"roost_broker_publish_seconds_count",
	"roost_broker_publish_seconds_sum",
	"roost_broker_rebroadcasts_total",
	"roost_bytes_out_total",
	"roost_commit_batch_size_bucket",
	"roost_commit_batch_size_count",
	"roost_commit_batch_size_sum",
	"roost_commit_batches_total",
	"roost_commit_duplicates_total",
	"roost_connection_budget",
	"roost_connections",
	"roost_connections_refused_total",
	"roost_conn_events_commit_errors_total",
	"roost_conn_events_committed_total",
	"roost_conn_events_delivered_total",
	"roost_conn_events_dropped_total",
	"roost_conn_events_owed",
	"roost_conn_events_total",
	"roost_connections_total_open",
	"roost_frames_in_total",
	"roost_frames_out_total",
	"roost_gap_closes_total",
	"roost_catchups_abandoned_total",
	"roost_catchups_deferred_total",
	"roost_store_reads_refused_total",
	"roost_unread_refused_total",
	"roost_receipts_refused_total",
	"roost_gap_repairs_total",
	"roost_join_reads_total",
	"roost_join_replays_total",
	"roost_loop_inbox_depth",
	"roost_loop_inbox_overflow_total",
	"roost_memory_store_bytes",
	"roost_memory_store_evicted_total",
	"roost_memory_store_max_bytes",
	"roost_node_info",
	"roost_overloaded_total",
	"roost_publish_latency_seconds_bucket",
	"roost_publish_latency_seconds_count",
	"roost_publish_latency_seconds_sum",
	"roost_publish_queue_depth",
	"roost_publish_rejected_total",
	"roost_publishes_in_flight",
	"roost_publishes_inbox_full_total",
	"roost_publishes_refused_total",
	"roost_publishes_shed_total",
	"roost_publishes_total",
	"roost_redis_malformed_total",
	"roost_redis_pending_rooms",
	"roost_redis_publish_errors_total",
	"roost_redis_published_total",
	"roost_redis_received_total",
	"roost_redis_resubscribes_total",
	"roost_redis_subscribe_errors_total",
	"roost_redis_subscribed_rooms",
	"roost_resumes_lost_total",
	"roost_retention_deleted_total",
	"roost_retention_errors_total",
	"roost_retention_runs_total",
	"roost_room_memberships",
	"roost_rooms",
	"roost_rooms_refused_total",
	"roost_slow_consumer_closes_total",
	"roost_presence_apply_errors_total",
	"roost_presence_changes_total",
	"roost_presence_diff_frames_total",
	"roost_signals_sent_total",
	"roost_signals_skipped_total",
	"roost_signals_limited_total",
	"roost_read_marks_written_total",
	"roost_read_marks_coalesced_total",
	"roost_read_marks_checked_total",
	"roost_read_mark_lookups_total",
	"roost_read_position_lookups_total",
	"roost_read_marks_dropped_total",
	"roost_read_save_errors_total",
	"roost_read_requests_limited_total",
	"roost_presence_wakes_total",
	"roost_sse_connections_open",
	"roost_sse_max_age_ends_total",
	"roost_sse_streams_total",
	"roost_store_errors_total",
	"roost_upgrade_errors_total",
	"roost_upgrading_connections",
	"roost_write_frames_bucket",
	"roost_write_frames_count",
	"roost_write_frames_sum",
	"roost_writes_total",
	"roost_pings_total",
	"roost_pongs_held_total",
	"roost_pongs_taken_total",
	"roost_uring_submits_total",
	"roost_uring_ops_total",
	"roost_uring_refused_total",
	"roost_loop_ticks_total",
	"roost_loop_short_ticks_total",
	"roost_loop_sweeps_total",
	"roost_disconnected_total",
	"roost_api_requests_total",
	"roost_api_published_total",
	"roost_api_publish_duplicates_total",
	"roost_api_disconnected_total",
	"roost_api_connections_held",
	"roost_api_connections_waiting",
	"roost_api_connections_evicted_total",
	"roost_api_connections_busy_total",
	"roost_api_refused_total",
	"roost_api_publish_seconds_bucket",
	"roost_api_publish_seconds_count",
	"roost_api_publish_seconds_sum",
	"roost_webhook_events_total",
	"roost_webhook_delivered_total",
	"roost_webhook_posts_total",
	"roost_webhook_failures_total",
	"roost_webhook_dropped_total",
	"roost_webhook_dead_total",
	"roost_webhook_read_total",
	"roost_webhook_owed",
	"roost_webhook_held_bytes",
	"roost_webhook_lag_seconds_bucket",
	"roost_webhook_lag_seconds_count",
	"roost_webhook_lag_seconds_sum",
	"roost_proxy_calls_total",
	"roost_proxy_call_seconds_bucket",
	"roost_proxy_call_seconds_count",
	"roost_proxy_call_seconds_sum",
}

func TestMetricNamesKept(t *testing.T) {
	redistest.Require(t)
	addr, admin := inProcessNode(t, "--redis-url", "redis://"+redistest.Addr+"?prefix="+redistest.Prefix(t), "--api", "127.0.0.1:0")
	c := dialOps(t, addr, "user=u&app=names")
	if err := c.send(`{"op":"join","room":"r"}`); err != nil {
		t.Fatal(err)
	}
	c.expect("joined")
	seen := map[string]bool{}
	for k := range scrape(t, admin) {
		if i := strings.IndexByte(k, '{'); i >= 0 {
			k = k[:i]
		}
		seen[k] = true
	}
	want := map[string]bool{}
	for _, n := range exposedMetrics {
		want[n] = true
		// Series per app with a webhook: this node has none.
		if !seen[n] && n != "roost_webhook_dropped_total" {
			t.Errorf("/metrics lacks %s", n)
		}
	}
	var extra []string
	for n := range seen {
		if strings.HasPrefix(n, "roost_") && !want[n] {
			extra = append(extra, n)
		}
	}
	sort.Strings(extra)
	if len(extra) > 0 {
		t.Errorf("/metrics has roost series not in exposedMetrics (add them): %v", extra)
	}
}

// The exposition parses as Prometheus text: one TYPE line per family,
// before its first sample, and no series twice.
func TestMetricsExposition(t *testing.T) {
	_, admin := inProcessNode(t)
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	typed := map[string]string{}
	seen := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if f, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name, typ, _ := strings.Cut(f, " ")
			if typed[name] != "" {
				t.Errorf("second TYPE line for %s", name)
			}
			typed[name] = typ
			continue
		}
		if line == "" || line[0] == '#' {
			continue
		}
		series := line[:strings.LastIndexByte(line, ' ')]
		if seen[series] {
			t.Errorf("series %s written twice", series)
		}
		seen[series] = true
		name := series
		if i := strings.IndexByte(name, '{'); i >= 0 {
			name = name[:i]
		}
		family := name
		if typed[family] == "" {
			for _, suf := range []string{"_bucket", "_sum", "_count"} {
				if f, ok := strings.CutSuffix(name, suf); ok && typed[f] != "" {
					family = f
				}
			}
		}
		if typed[family] == "" {
			t.Errorf("%s has no TYPE line before it", series)
		}
	}
	for _, want := range []struct{ name, typ string }{
		{"roost_acks_total", "counter"},
		{"roost_rooms", "gauge"},
		{"roost_publish_latency_seconds", "histogram"},
		{"roost_commit_batch_size", "histogram"},
		{"process_cpu_seconds_total", "counter"},
	} {
		if typed[want.name] != want.typ {
			t.Errorf("%s has type %q, want %s", want.name, typed[want.name], want.typ)
		}
	}
}

func TestLabelValueEscaped(t *testing.T) {
	if got := labelValue("a\\b\"c\nd"); got != `a\\b\"c\nd` {
		t.Fatalf("labelValue = %q", got)
	}
	if got := labelValue("node-1"); got != "node-1" {
		t.Fatalf("labelValue = %q", got)
	}
}

// process_open_fds is the library's count (a listing of /proc/self/fd)
// without the listing: 200 more descriptors show as 200 more.
func TestOpenFDsCounted(t *testing.T) {
	read := func() (open, limit float64) {
		var b strings.Builder
		writeFDMetrics(&b)
		for _, line := range strings.Split(b.String(), "\n") {
			name, v, ok := strings.Cut(line, " ")
			if !ok || name[0] == '#' {
				continue
			}
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			switch name {
			case "process_open_fds":
				open = f
			case "process_max_fds":
				limit = f
			}
		}
		return open, limit
	}
	listed := func() int {
		names, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Skip("no /proc/self/fd:", err)
		}
		return len(names) - 1 // the listing's own descriptor
	}
	// Other tests of the package leave goroutines behind that open and
	// close descriptors of their own (a child's pipes, a dial), so one
	// attempt can see another's descriptor come or go between the reads.
	// A miscount shows in every attempt; that noise does not.
	var msgs []string
	for attempt := 0; attempt < 5; attempt++ {
		before, limit := read()
		if got := listed(); math.Abs(before-float64(got)) > 2 || limit < before {
			t.Fatalf("process_open_fds %v, process_max_fds %v; /proc/self/fd lists %d", before, limit, got)
		}
		var files []*os.File
		for range 100 {
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, r, w)
		}
		after, _ := read()
		for _, f := range files {
			_ = f.Close()
		}
		if after-before == 200 {
			return
		}
		msgs = append(msgs, fmt.Sprintf("%v (%v -> %v)", after-before, before, after))
	}
	t.Fatalf("200 more descriptors counted as %s more", strings.Join(msgs, ", "))
}

// The PostgreSQL store's own counters reach /metrics: a node on a database
// meets a publish resent after its first commit, whose key the fresh
// commit does not look up; the statement fails on the unique index and the
// batch goes again with the lookup, which roost_store_commit_rechecks_total
// counts. The client gets the first seq again.
func TestPostgresStoreMetricsExposed(t *testing.T) {
	url := pgtest.NewDB(t)
	addr, admin := inProcessNode(t, "--database-url", url, "--migrate")
	c := dialOps(t, addr, "user=u&app=pgm")
	var seqs []float64
	for _, id := range []string{"a", "b", "a"} {
		if err := c.send(`{"op":"pub","room":"r","id":"` + id + `","body":1}`); err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, c.expect("ack").json["seq"].(float64))
	}
	if seqs[0] != 1 || seqs[1] != 2 || seqs[2] != 1 {
		t.Fatalf("acked seqs %v, want [1 2 1]", seqs)
	}
	m := scrape(t, admin)
	for _, name := range []string{
		"roost_store_deadlocks_total",
		"roost_store_commit_retries_total",
		`roost_store_commits_in_doubt_total{outcome="committed"}`,
		`roost_store_commits_in_doubt_total{outcome="rolled_back"}`,
		`roost_store_commits_in_doubt_total{outcome="unknown"}`,
		"roost_rooms_refused_total",
	} {
		if v, ok := m[name]; !ok || v != 0 {
			t.Errorf("%s = %v (exposed %v), want 0", name, v, ok)
		}
	}
	if m["roost_store_pool_acquires_total"] < 3 || m["roost_store_pool_max_conns"] < 1 || m[`roost_store_pool_conns{state="idle"}`] < 1 {
		t.Errorf("pool: acquires %v, max %v, idle %v", m["roost_store_pool_acquires_total"], m["roost_store_pool_max_conns"], m[`roost_store_pool_conns{state="idle"}`])
	}
	for _, name := range []string{"roost_store_pool_empty_acquires_total", "roost_store_pool_empty_acquire_wait_seconds_total", `roost_store_pool_conns{state="acquired"}`} {
		if _, ok := m[name]; !ok {
			t.Errorf("%s not exposed", name)
		}
	}
	if v := m["roost_store_commit_rechecks_total"]; v != 1 {
		t.Errorf("roost_store_commit_rechecks_total = %v, want 1", v)
	}
	if _, ok := m["roost_memory_store_bytes"]; ok {
		t.Error("a PostgreSQL node exposes roost_memory_store_bytes")
	}
}
