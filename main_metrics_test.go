package main

import (
	"sort"
	"strings"
	"testing"

	"github.com/roost-chat/roost/pubsub/redistest"
)

// exposedMetrics is every series name /metrics exposes (with Redis, the
// memory store, one connection): dashboards and alerts are written
// against them, so a rename or a loss fails here.
var exposedMetrics = []string{
	"go_goroutines",
	"go_heap_objects_bytes",
	"go_memory_total_bytes",
	"roost_accepted_total",
	"roost_app_refusals_total",
	"roost_app_remote_connections",
	"roost_ack_latency_seconds_bucket",
	"roost_ack_latency_seconds_count",
	"roost_ack_latency_seconds_sum",
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
	"roost_connections_total_open",
	"roost_frames_in_total",
	"roost_frames_out_total",
	"roost_gap_closes_total",
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
	"roost_retention_deleted_total",
	"roost_retention_errors_total",
	"roost_retention_runs_total",
	"roost_room_memberships",
	"roost_rooms",
	"roost_rooms_refused_total",
	"roost_slow_consumer_closes_total",
	"roost_store_errors_total",
	"roost_upgrade_errors_total",
	"roost_upgrading_connections",
	"roost_write_frames_bucket",
	"roost_write_frames_count",
	"roost_write_frames_sum",
	"roost_writes_total",
}

func TestMetricNamesKept(t *testing.T) {
	redistest.Require(t)
	addr, admin := inProcessNode(t, "--redis-url", "redis://"+redistest.Addr+"?prefix="+redistest.Prefix(t))
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
		if !seen[n] {
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
