package loop

import (
	"fmt"
	"io"
	"strconv"

	vm "github.com/VictoriaMetrics/metrics"
)

// RegisterMetrics adds the loops' series to set: connections per app,
// admissions and refusals, frames, writes, the io_uring, ticks, publishes,
// the inboxes, the loops' histograms (frames per write, ack latency),
// and (through the proxy pool the loops own) the proxy calls. They are read from the counters the loops bump at scrape time,
// so the hot path only adds to atomics. With the library's metadata on
// (vm.ExposeMetadata), each family gets its HELP and TYPE lines once.
func (s *Server) RegisterMetrics(set *vm.Set) {
	set.RegisterMetricsWriter(s.writeMetrics)
	s.proxy.RegisterMetrics(set)
}

func (s *Server) writeMetrics(w io.Writer) {
	st := &s.Stats
	c := func(name string, v uint64) { vm.WriteCounterUint64(w, name, v) }
	g := func(name string, v int64) {
		vm.WriteMetadataIfNeeded(w, name, "gauge")
		fmt.Fprintf(w, "%s %d\n", name, v)
	}
	// App ids are [A-Za-z0-9_.-] (proto.ValidAppID), which %q writes as
	// they are; it escapes a quote, backslash or newline as the text format
	// wants, should a registry row hold one.
	// A family's series follow its metadata together: one pass each.
	vm.WriteMetadataIfNeeded(w, "roost_connections", "gauge")
	s.AppStats(func(id string, st *AppStat) {
		fmt.Fprintf(w, "roost_connections{app=%q} %d\n", id, st.Conns)
	})
	vm.WriteMetadataIfNeeded(w, "roost_app_remote_connections", "gauge")
	s.AppStats(func(id string, st *AppStat) {
		fmt.Fprintf(w, "roost_app_remote_connections{app=%q} %d\n", id, st.Remote)
	})
	vm.WriteMetadataIfNeeded(w, "roost_app_refusals_total", "counter")
	s.AppStats(func(id string, st *AppStat) {
		for i, name := range RefusalNames {
			fmt.Fprintf(w, "roost_app_refusals_total{app=%q,reason=\"%s\"} %d\n", id, name, st.Refused[i])
		}
	})
	g("roost_connections_total_open", st.Conns.Load())
	g("roost_sse_connections_open", st.SSEConns.Load())
	c("roost_sse_streams_total", st.SSEOpened.Load())
	c("roost_sse_max_age_ends_total", st.SSEMaxAge.Load())
	g("roost_upgrading_connections", st.Upgrading.Load())
	c("roost_accepted_total", st.Accepted.Load())
	c("roost_upgrade_errors_total", st.UpgradeErrors.Load())
	vm.WriteMetadataIfNeeded(w, "roost_connections_refused_total", "counter")
	fmt.Fprintf(w, "roost_connections_refused_total{reason=\"budget\"} %d\n", st.RefusedBudget.Load())
	fmt.Fprintf(w, "roost_connections_refused_total{reason=\"per_ip\"} %d\n", st.RefusedPerIP.Load())
	fmt.Fprintf(w, "roost_connections_refused_total{reason=\"proxy_header\"} %d\n", st.RefusedProxyHeader.Load())
	g("roost_connection_budget", int64(s.MaxConns()))
	g("roost_rooms", int64(s.fan.Rooms()))

	c("roost_frames_in_total", st.FramesIn.Load())
	c("roost_frames_out_total", st.FramesOut.Load())
	c("roost_bytes_out_total", st.BytesOut.Load())
	c("roost_writes_total", st.Writes.Load())
	c("roost_uring_submits_total", st.Ring.Submits.Load())
	c("roost_uring_ops_total", st.Ring.Ops.Load())
	c("roost_uring_refused_total", st.Ring.Refused.Load())
	c("roost_pongs_held_total", st.PongsHeld.Load())
	c("roost_pongs_taken_total", st.PongsTaken.Load())
	c("roost_pings_total", st.Pings.Load())
	c("roost_loop_ticks_total", st.Ticks.Load())
	c("roost_loop_short_ticks_total", st.ShortTicks.Load())
	c("roost_loop_sweeps_total", st.Sweeps.Load())

	c("roost_publishes_total", st.Publishes.Load())
	c("roost_acks_total", st.Acks.Load())
	g("roost_publishes_in_flight", st.InFlight.Load())
	// Refused for overload at either edge of the loop: a publish here, a
	// store read (join, history) in fanout's readers.
	c("roost_overloaded_total", st.Overloaded.Load()+s.fan.Stats.ReadsRefused.Load())
	c("roost_publishes_inbox_full_total", st.InboxFull.Load())
	c("roost_loop_inbox_overflow_total", st.InboxOverflow.Load())
	c("roost_publishes_shed_total", st.Shed.Load())
	c("roost_disconnected_total", st.Disconnected.Load())

	if n := s.Snapshot().Loops; n > 0 {
		vm.WriteMetadataIfNeeded(w, "roost_loop_inbox_depth", "gauge")
		for i := 0; i < n; i++ {
			io.WriteString(w, "roost_loop_inbox_depth{loop=\""+strconv.Itoa(i)+"\"} "+strconv.FormatInt(st.InboxDepth[i].Load(), 10)+"\n")
		}
	}
	s.hists.writeFrames.Write(w)
	s.hists.ackLatency.Write(w)
}
