package fanout

import (
	"fmt"
	"io"

	vm "github.com/VictoriaMetrics/metrics"
)

// RegisterMetrics adds the publish path's series to set: the publish
// pool (batches, their sizes, duplicates, refusals, the queue), rooms and
// memberships, delivery repairs, presence, signals, read positions and
// the broker hand-off, and the publish path's latency histograms (with
// the loops' phases of roost_ack_phase_seconds). They are read from the counters at scrape time, so
// the hot path only adds to atomics.
func (n *Node) RegisterMetrics(set *vm.Set) {
	set.RegisterMetricsWriter(n.writeMetrics)
}

func (n *Node) writeMetrics(w io.Writer) {
	fs := &n.Stats
	c := func(name string, v uint64) { vm.WriteCounterUint64(w, name, v) }
	g := func(name string, v int64) {
		vm.WriteMetadataIfNeeded(w, name, "gauge")
		fmt.Fprintf(w, "%s %d\n", name, v)
	}
	g("roost_room_memberships", fs.Joined.Load())

	ps := n.PoolStats()
	// The pool counts batch sizes by bucket but not their sum; publishes
	// answered is the closest total (it includes those of failed commits).
	vm.WriteMetadataIfNeeded(w, "roost_commit_batch_size", "histogram")
	var cum uint64
	for i, b := range BatchBuckets {
		cum += ps.BatchSizes[i]
		fmt.Fprintf(w, "roost_commit_batch_size_bucket{le=\"%d\"} %d\n", b, cum)
	}
	cum += ps.BatchSizes[len(BatchBuckets)]
	fmt.Fprintf(w, "roost_commit_batch_size_bucket{le=\"+Inf\"} %d\n", cum)
	fmt.Fprintf(w, "roost_commit_batch_size_sum %d\n", ps.Requests)
	fmt.Fprintf(w, "roost_commit_batch_size_count %d\n", cum)
	c("roost_commit_batches_total", ps.Batches)
	c("roost_commit_duplicates_total", ps.Duplicates)
	c("roost_store_errors_total", ps.CommitErrors)
	c("roost_publishes_refused_total", ps.Refused)
	c("roost_publish_rejected_total", ps.Rejected)
	g("roost_publish_queue_depth", int64(ps.QueueDepth))

	c("roost_slow_consumer_closes_total", fs.SlowCloses.Load())
	c("roost_gap_repairs_total", fs.Repairs.Load())
	c("roost_join_replays_total", fs.Replays.Load())
	c("roost_join_reads_total", fs.ReplayReads.Load())
	c("roost_resumes_lost_total", fs.ResumesLost.Load())
	c("roost_presence_changes_total", fs.PresenceChanges.Load())
	c("roost_presence_apply_errors_total", fs.PresenceErrors.Load())
	c("roost_presence_diff_frames_total", fs.PresenceFrames.Load())
	c("roost_presence_wakes_total", fs.PresenceWakes.Load())
	c("roost_signals_sent_total", fs.SignalsSent.Load())
	c("roost_signals_skipped_total", fs.SignalsSkipped.Load())
	c("roost_signals_limited_total", fs.SignalsLimited.Load())
	c("roost_read_marks_written_total", fs.ReadMarksWritten.Load())
	c("roost_read_marks_coalesced_total", fs.ReadMarksCoalesced.Load())
	c("roost_read_marks_checked_total", fs.ReadMarksChecked.Load())
	c("roost_read_mark_lookups_total", fs.ReadLookups.Load())
	c("roost_read_position_lookups_total", fs.ReadPositionLookups.Load())
	c("roost_read_marks_dropped_total", fs.ReadMarksDropped.Load())
	c("roost_read_save_errors_total", fs.ReadSaveErrors.Load())
	c("roost_read_requests_limited_total", fs.ReadsLimited.Load())
	c("roost_gap_closes_total", fs.GapCloses.Load())
	c("roost_catchups_abandoned_total", fs.CatchupsAbandoned.Load())
	c("roost_catchups_deferred_total", fs.CatchupsDeferred.Load())
	c("roost_store_reads_refused_total", fs.ReadsRefused.Load())
	c("roost_unread_refused_total", fs.UnreadRefused.Load())
	c("roost_receipts_refused_total", fs.ReceiptsRefused.Load())
	c("roost_broker_errors_total", fs.BrokerErrors.Load())
	c("roost_broker_rebroadcasts_total", fs.Rebroadcasts.Load())
	c("roost_broker_dropped_total", fs.BrokerDropped.Load())
	n.events.writeMetrics(w)
	n.hists.write(w)
}
