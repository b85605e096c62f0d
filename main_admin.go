package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/roost-chat/roost/fanout"
	"github.com/roost-chat/roost/loop"
	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/pubsub"
	"github.com/roost-chat/roost/tuning"
)

// admin is what the admin listener reads: the node's counters and its
// readiness. redis is nil with the in-process broker.
type admin struct {
	srv   *loop.Server
	fan   *fanout.Node
	hists *histograms
	store persist.Store
	redis *pubsub.Redis
	ready *atomic.Bool
}

// Bucket bounds of the node's histograms.
var (
	latencyBuckets     = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5}
	writeFramesBuckets = []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}
)

// histograms are the node's histograms, fed by the loops and fanout and
// read by the scrape.
type histograms struct {
	writeFrames    *tuning.Histogram // frames per writev: the batch size of one write
	publishLatency *tuning.Histogram // seconds from a pub frame read to its commit
	ackLatency     *tuning.Histogram // seconds from a pub frame read to its ack queued
	brokerLatency  *tuning.Histogram // seconds one broker Publish of a committed message takes
	deliveryLag    *tuning.Histogram // seconds from commit to arrival through the broker, sampled
}

func newHistograms() *histograms {
	return &histograms{
		writeFrames:    tuning.NewHistogram(writeFramesBuckets...),
		publishLatency: tuning.NewHistogram(latencyBuckets...),
		ackLatency:     tuning.NewHistogram(latencyBuckets...),
		brokerLatency:  tuning.NewHistogram(latencyBuckets...),
		deliveryLag:    tuning.NewHistogram(latencyBuckets...),
	}
}

// adminMux serves operators, apart from clients: pprof from the first day,
// liveness, readiness and metrics.
func adminMux(a *admin) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", redactedCmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		// Liveness: the process answers. Dependencies are /readyz's job, so
		// a Redis outage does not get every node restarted at once. Loops
		// that are gone are this process's own failure: never a green
		// zombie.
		if a.srv.Dead() {
			http.Error(w, "not alive: client listener stopped: "+a.srv.DeathCause(), http.StatusServiceUnavailable)
			return
		}
		sn := a.srv.Snapshot()
		_, _ = io.WriteString(w, "ok node="+a.srv.NodeID()+" conns="+strconv.FormatInt(sn.Conns, 10)+" rooms="+strconv.FormatInt(sn.Rooms, 10)+" loops="+strconv.Itoa(sn.Loops)+"\n")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if a.srv.Dead() {
			http.Error(w, "not ready: client listener stopped: "+a.srv.DeathCause(), http.StatusServiceUnavailable)
			return
		}
		if !a.ready.Load() {
			http.Error(w, "not ready: starting or draining", http.StatusServiceUnavailable)
			return
		}
		if a.redis != nil {
			ctx, cancel := context.WithTimeout(r.Context(), time.Second)
			defer cancel()
			// Rooms waiting for their subscription are normal for a moment
			// after every new join; only an unreachable Redis makes the node
			// unfit for new clients (roost_redis_pending_rooms shows the rest).
			if err := a.redis.Ping(ctx); err != nil && !errors.Is(err, pubsub.ErrNotSubscribed) {
				http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		_, _ = io.WriteString(w, "ready\n")
	})
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_ = writeMetrics(w, a)
	})
	return mux
}

// redactedCmdline is pprof's cmdline with the values of secret-bearing
// flags and URL passwords masked: the admin listener is for operators, but
// a secret must not leak through a debug page.
func redactedCmdline(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = io.WriteString(w, strings.Join(redactArgs(os.Args), "\x00"))
}

// secretFlags carry secrets in their values.
var secretFlags = map[string]bool{"app-secret": true, "secret": true}

// redactArgs masks --app-secret and --secret values (in both the "--flag
// value" and "--flag=value" forms) and the passwords of URLs.
func redactArgs(args []string) []string {
	out := make([]string, len(args))
	maskNext := false
	for i, a := range args {
		switch {
		case maskNext:
			out[i] = maskSecretValue(a)
			maskNext = false
			continue
		case strings.HasPrefix(a, "-"):
			name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
			if secretFlags[name] {
				if hasVal {
					out[i] = a[:len(a)-len(val)] + maskSecretValue(val)
				} else {
					out[i], maskNext = a, true
				}
				continue
			}
		}
		out[i] = maskURLs(a)
	}
	return out
}

// maskSecretValue masks APP=SECRET lists, keeping the ids, or a bare secret.
func maskSecretValue(v string) string {
	if strings.Contains(v, "=") {
		return maskAppSecrets(v)
	}
	return "*****"
}

// writeMetrics prints the node's metrics in the Prometheus text format.
// The hot path only bumps atomics; the formatting cost is the scraper's.
func writeMetrics(w io.Writer, a *admin) error {
	m := tuning.NewMetricsWriter(w)
	st := &a.srv.Stats
	fs := &a.fan.Stats
	h := a.hists
	sn := a.srv.Snapshot()
	c := func(name, help string, v uint64) { m.Counter(name, help, float64(v)) }
	g := func(name, help string, v int64) { m.Gauge(name, help, float64(v)) }
	m.Gauge("roost_node_info", "Always 1; labels name this node and its version.", 1, "node", a.srv.NodeID(), "version", version)

	a.srv.AppStats(func(id string, st *loop.AppStat) {
		m.Gauge("roost_connections", "Open WebSocket connections, by app.", float64(st.Conns), "app", id)
	})
	a.srv.AppStats(func(id string, st *loop.AppStat) {
		m.Gauge("roost_app_remote_connections", "The app's connections on the other nodes, as last shared through Redis.", float64(st.Remote), "app", id)
	})
	a.srv.AppStats(func(id string, st *loop.AppStat) {
		for i, name := range loop.RefusalNames {
			m.Counter("roost_app_refusals_total", "Refusals by app and reason: conn_limit and user_conn_limit (closed 1008), user_rate and app_rate (err rate_limited), too_large, room_limit, auth (bad token or refresh), disabled.", float64(st.Refused[i]), "app", id, "reason", name)
		}
	})
	g("roost_connections_total_open", "Open WebSocket connections, all apps.", st.Conns.Load())
	g("roost_upgrading_connections", "TCP connections still in the HTTP upgrade.", st.Upgrading.Load())
	c("roost_accepted_total", "TCP connections accepted.", st.Accepted.Load())
	c("roost_upgrade_errors_total", "Connections refused before the upgrade (HTTP 4xx).", st.UpgradeErrors.Load())
	m.Counter("roost_connections_refused_total", "Connections closed at accept: past the connection budget (--max-conns) or the per-address cap (--max-conns-per-ip).", float64(st.RefusedBudget.Load()), "reason", "budget")
	m.Counter("roost_connections_refused_total", "Connections closed at accept: past the connection budget (--max-conns) or the per-address cap (--max-conns-per-ip).", float64(st.RefusedPerIP.Load()), "reason", "per_ip")
	g("roost_connection_budget", "The connection budget (--max-conns, or derived from the open-file limit); 0: none.", int64(a.srv.MaxConns()))
	g("roost_room_memberships", "Live room memberships: joined rooms summed over connections.", fs.Joined.Load())
	g("roost_rooms", "Rooms this node is subscribed to (at least one member or joiner).", sn.Rooms)

	c("roost_frames_in_total", "WebSocket frames read from clients.", st.FramesIn.Load())
	c("roost_frames_out_total", "WebSocket frames written to clients.", st.FramesOut.Load())
	c("roost_bytes_out_total", "Bytes of frames written to clients.", st.BytesOut.Load())
	c("roost_writes_total", "Writes to client sockets (one writev each).", st.Writes.Load())
	m.Histogram("roost_write_frames", "Frames per write to one connection: the outbound batch size.", h.writeFrames.Snapshot())

	c("roost_publishes_total", "pub frames submitted for commit.", st.Publishes.Load())
	c("roost_acks_total", "ack frames sent.", st.Acks.Load())
	g("roost_publishes_in_flight", "Publishes submitted and not yet answered.", st.InFlight.Load())
	c("roost_overloaded_total", "Commands answered err overloaded (publish queue or read queue full, draining, or shed).", st.Overloaded.Load()+fs.ReadsRefused.Load())
	c("roost_publishes_inbox_full_total", "Publishes answered err overloaded because their event loop's inbox held --inbox-limit tasks.", st.InboxFull.Load())
	c("roost_loop_inbox_overflow_total", "Deliveries that found their event loop's inbox full: not queued; their rooms were read from the store instead.", st.InboxOverflow.Load())
	c("roost_publishes_shed_total", "Publishes answered err overloaded because their event loop's publishes took longer than --shed-after from read to commit.", st.Shed.Load())
	m.Histogram("roost_publish_latency_seconds", "From a pub frame read to its commit (including a failed one).", h.publishLatency.Snapshot())
	m.Histogram("roost_ack_latency_seconds", "From a pub frame read to its ack queued to the client.", h.ackLatency.Snapshot())

	ps := a.fan.PoolStats()
	bounds := make([]float64, len(persist.BatchBuckets))
	for i, b := range persist.BatchBuckets {
		bounds[i] = float64(b)
	}
	// The pool counts batch sizes by bucket but not their sum; publishes
	// answered is the closest total (it includes those of failed commits).
	m.Histogram("roost_commit_batch_size", "Publishes per successful group commit; _sum counts every publish answered.",
		tuning.HistogramValue{Bounds: bounds, Counts: ps.BatchSizes[:], Sum: float64(ps.Requests)})
	c("roost_commit_batches_total", "Group commits that succeeded.", ps.Batches)
	c("roost_commit_duplicates_total", "Publishes answered as duplicates (same user, room and id).", ps.Duplicates)
	c("roost_store_errors_total", "Group commits that failed (their publishes were answered with err).", ps.CommitErrors)
	c("roost_publishes_refused_total", "Publishes the store refused on their own (a failed group commit split until the bad one stood alone); each is logged.", ps.Refused)
	c("roost_publish_rejected_total", "Publishes refused because the publish queue was full.", ps.Rejected)
	g("roost_publish_queue_depth", "Publishes waiting in the publish workers' queues.", int64(ps.QueueDepth))

	rs := a.store.RetentionStats()
	m.Counter("roost_retention_deleted_total", "Messages removed by retention, by rule: age (max age) or count (max count; the memory store's --keep too).", float64(rs.DeletedByAge), "rule", "age")
	m.Counter("roost_retention_deleted_total", "Messages removed by retention, by rule: age (max age) or count (max count; the memory store's --keep too).", float64(rs.DeletedByCount), "rule", "count")
	c("roost_retention_runs_total", "Retention rounds completed (every --retention-interval).", rs.Runs)
	c("roost_retention_errors_total", "Retention rounds that failed (retried at the next round; the log says why).", rs.Errors)
	switch st := a.store.(type) {
	case *persist.Memory:
		ms := st.Stats()
		g("roost_memory_store_bytes", "Bytes the memory store holds, by its accounting (messages, rooms, ring slots).", ms.Bytes)
		g("roost_memory_store_max_bytes", "The memory store's byte budget (--memory-store-max; 0: none).", ms.MaxBytes)
		c("roost_memory_store_evicted_total", "Messages the memory store dropped to stay within --memory-store-max (least recently written rooms first, oldest first).", ms.Evicted)
		c("roost_rooms_refused_total", "Publishes and joins refused because their app has --max-rooms-per-app rooms.", ms.RoomsRefused)
	case *persist.Postgres:
		c("roost_rooms_refused_total", "Publishes and joins refused because their app has --max-rooms-per-app rooms.", st.RoomsRefused())
	}

	c("roost_slow_consumer_closes_total", "Connections closed with 1013 for passing --outbound-limit.", fs.SlowCloses.Load())
	c("roost_gap_repairs_total", "Store reads to fill a gap in a room's stream.", fs.Repairs.Load())
	c("roost_join_replays_total", "Catch-up pages asked by joins with since (a rejoin far behind asks several).", fs.Replays.Load())
	c("roost_join_reads_total", "Store reads those catch-ups took: the rejoins of one room share theirs, so a reconnect storm costs about one per room.", fs.ReplayReads.Load())
	c("roost_gap_closes_total", "Rooms whose members were closed with 1013 because a gap could not be filled.", fs.GapCloses.Load())
	c("roost_broker_errors_total", "Broker publishes of committed messages that failed (each is retried).", fs.BrokerErrors.Load())
	c("roost_broker_rebroadcasts_total", "Failed broadcasts delivered by a later retry.", fs.Rebroadcasts.Load())
	c("roost_broker_dropped_total", "Failed broadcasts given up after their retries (receivers repair from the store).", fs.BrokerDropped.Load())
	m.Histogram("roost_broker_publish_seconds", "Time one broker round trip takes: the committed messages of one group commit, pipelined; the broker's lag.", h.brokerLatency.Snapshot())
	m.Histogram("roost_broker_delivery_lag_seconds", "Commit to arrival at this node through the broker, sampled 1 message in 64 (across nodes it includes clock offset).", h.deliveryLag.Snapshot())
	if a.redis != nil {
		rs := a.redis.Stats()
		c("roost_redis_published_total", "Messages published to Redis.", rs.Published)
		c("roost_redis_publish_errors_total", "Redis publishes that failed.", rs.PublishErrors)
		c("roost_redis_received_total", "Messages received from Redis subscriptions.", rs.Received)
		c("roost_redis_malformed_total", "Undecodable messages on roost's Redis channels.", rs.Malformed)
		c("roost_redis_resubscribes_total", "Recoveries after a lost Redis subscription connection.", rs.Resubscribes)
		c("roost_redis_subscribe_errors_total", "Failed Redis SUBSCRIBE/SSUBSCRIBE attempts.", rs.SubscribeErrors)
		g("roost_redis_subscribed_rooms", "Rooms subscribed on Redis.", rs.Subscribed)
		g("roost_redis_pending_rooms", "Rooms wanted but not yet subscribed on Redis (subscription lag).", rs.Pending)
	}

	for i := 0; i < sn.Loops; i++ {
		m.Gauge("roost_loop_inbox_depth", "Tasks an event loop took from its inbox in its latest wake-up.", float64(st.InboxDepth[i].Load()), "loop", strconv.Itoa(i))
	}

	g("go_goroutines", "Goroutines.", int64(runtime.NumGoroutine()))
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/memory/classes/total:bytes"}}
	metrics.Read(sample)
	if sample[0].Value.Kind() == metrics.KindUint64 {
		g("go_heap_objects_bytes", "Bytes of live and not yet swept heap objects.", int64(sample[0].Value.Uint64()))
	}
	if sample[1].Value.Kind() == metrics.KindUint64 {
		g("go_memory_total_bytes", "Memory mapped by the Go runtime.", int64(sample[1].Value.Uint64()))
	}
	return m.Flush()
}
