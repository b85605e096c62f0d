package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	vm "github.com/VictoriaMetrics/metrics"

	"github.com/roost-chat/roost/fanout"
	"github.com/roost-chat/roost/loop"
	"github.com/roost-chat/roost/pubsub"
)

// admin is what the admin listener reads: the node's metrics, its
// liveness and readiness. redis is nil with the in-process broker.
type admin struct {
	srv     *loop.Server
	fan     *fanout.Node
	metrics *vm.Set // every part's series, registered by the part itself
	redis   *pubsub.Redis
	ready   *atomic.Bool
	token   string       // --admin-token: "" leaves the listener open
	board   *statusBoard // the admin page's samples
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
	if a.board != nil {
		mux.HandleFunc("GET /{$}", a.board.servePage)
		mux.HandleFunc("GET /admin/status", a.board.serveStatus)
	}
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
var secretFlags = map[string]bool{"app-secret": true, "secret": true, "admin-token": true}

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

// writeMetrics prints the node's metrics in the Prometheus text format
// through the metrics library: the series each part registered on
// a.metrics (counters and gauges read from the atomics the part bumps, so
// the hot path only adds to them, and its latency histograms), the node's
// info, the Go runtime's heap
// figures, and the library's standard go_* and process_* series. The
// formatting cost is the scraper's.
func writeMetrics(w io.Writer, a *admin) error {
	bw := bufio.NewWriterSize(w, 32<<10)
	if a.metrics != nil {
		a.metrics.WritePrometheus(bw)
	}
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/memory/classes/total:bytes"}}
	metrics.Read(sample)
	if sample[0].Value.Kind() == metrics.KindUint64 {
		vm.WriteGaugeUint64(bw, "go_heap_objects_bytes", sample[0].Value.Uint64())
	}
	if sample[1].Value.Kind() == metrics.KindUint64 {
		vm.WriteGaugeUint64(bw, "go_memory_total_bytes", sample[1].Value.Uint64())
	}
	// go_goroutines, go_memstats_*, go_gc_*, process_cpu_seconds_total,
	// process_resident_memory_bytes, process_open_fds, ...
	vm.WriteProcessMetrics(bw)
	// process_open_fds against process_max_fds: a node's connections are
	// its descriptors.
	writeFDMetrics(bw)
	return bw.Flush()
}

// nodeInfo registers roost_node_info{node,version} on set.
func nodeInfo(set *vm.Set, node string) {
	series := `roost_node_info{node="` + labelValue(node) + `",version="` + labelValue(version) + `"}`
	set.RegisterMetricsWriter(func(w io.Writer) {
		vm.WriteMetadataIfNeeded(w, "roost_node_info", "gauge")
		_, _ = io.WriteString(w, series+" 1\n")
	})
}

// writeFDMetrics writes process_max_fds and process_open_fds as the
// metrics library does, with the count from one stat(2) of /proc/self/fd
// where the kernel gives it (Linux 6.2 on: the directory's size is the
// number of open descriptors). The library lists the directory: with
// 15,000 connections that is 15,000 entries and 10 ms of CPU per scrape,
// which a scrape every 15 s turns into 0.07% of a core on an idle node.
// Elsewhere (size 0, or no /proc) the library's way.
func writeFDMetrics(w io.Writer) {
	fi, err := os.Stat("/proc/self/fd")
	var lim syscall.Rlimit
	if err != nil || fi.Size() <= 0 || syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) != nil {
		vm.WriteFDMetrics(w)
		return
	}
	vm.WriteGaugeUint64(w, "process_max_fds", lim.Cur) // the soft limit, as /proc/self/limits gives it
	vm.WriteGaugeUint64(w, "process_open_fds", uint64(fi.Size()))
}

// Prometheus reads a family's type from its TYPE line; without it every
// series would be untyped.
func init() { vm.ExposeMetadata(true) }

// labelValue escapes a label value as the text format wants: backslash,
// double quote and line feed.
func labelValue(s string) string {
	if !strings.ContainsAny(s, "\\\"\n") {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		switch r {
		case '\\':
			b.WriteString(`\\`)
		case '"':
			b.WriteString(`\"`)
		case '\n':
			b.WriteString(`\n`)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}
