package fanout

import (
	"io"

	"github.com/roost-chat/roost/fanout/hist"
)

// histograms are the publish path's latency histograms, registered by
// RegisterMetrics. roost_ack_phase_seconds holds the loops' two phases
// too (LoopAckPhases), so that one family writes an ack's whole split.
type histograms struct {
	publish     *hist.Histogram // seconds from a publish entering to its commit
	broker      *hist.Histogram // seconds one broker round trip of a commit batch takes
	deliveryLag *hist.Histogram // seconds from commit to arrival through the broker, sampled
	ackPhases   *hist.Family    // roost_ack_phase_seconds{phase}: an ack's time split (ackPhaseNames)
	// roost_unread_phase_seconds{phase} and roost_receipts_phase_seconds{phase}:
	// an unread request's and a receipts query's time split (queryPhaseNames)
	unreadPhases *hist.Family
	rcptPhases   *hist.Family
}

// ackPhaseNames are the phase label values of roost_ack_phase_seconds, in
// the order a publish passes them (docs/operations.md): AckPhases' six,
// then the loop's inbox and write.
var ackPhaseNames = []string{"queue", "pipeline", "window", "commit", "answer", "broker", "inbox", "write"}

// ackPhaseBuckets are finer than hist.LatencyBuckets where an ack's
// phases differ: a few milliseconds.
var ackPhaseBuckets = []float64{0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.0065, 0.008, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1}

// queryPhaseNames are the phase label values of roost_unread_phase_seconds
// and roost_receipts_phase_seconds, in the order a query passes them
// (docs/operations.md), indexed by the phase constants below.
var queryPhaseNames = []string{"positions", "queue", "store", "answer", "inbox"}

const (
	phasePositions = iota // asked on its loop (or by the API) until the positions goroutine takes it
	phaseQueue            // taken until a worker starts its store read
	phaseStore            // the store read
	phaseAnswer           // the read's end until the answer is posted to the loop
	phaseInbox            // posted until the loop runs it
)

func newHistograms() *histograms {
	return &histograms{
		publish:     hist.New("roost_publish_latency_seconds", hist.LatencyBuckets),
		broker:      hist.New("roost_broker_publish_seconds", hist.LatencyBuckets),
		deliveryLag: hist.New("roost_broker_delivery_lag_seconds", hist.LatencyBuckets),
		ackPhases:   hist.NewFamily("roost_ack_phase_seconds", "phase", ackPhaseNames, ackPhaseBuckets),
		// A query's phases are of the size of an ack's.
		unreadPhases: hist.NewFamily("roost_unread_phase_seconds", "phase", queryPhaseNames, ackPhaseBuckets),
		rcptPhases:   hist.NewFamily("roost_receipts_phase_seconds", "phase", queryPhaseNames, ackPhaseBuckets),
	}
}

func (h *histograms) fanoutAckPhases() AckPhases {
	f := h.ackPhases.Get
	return AckPhases{Queue: f(0), Pipeline: f(1), Window: f(2), Commit: f(3), Answer: f(4), Broker: f(5)}
}

// LoopAckPhases are the loops' share of roost_ack_phase_seconds: from the
// publish path's answer to the ack queued (the loop's inbox), and from
// the ack queued to its write to the socket.
func (n *Node) LoopAckPhases() (inbox, write Observer) {
	return n.hists.ackPhases.Get(6), n.hists.ackPhases.Get(7)
}

func (h *histograms) write(w io.Writer) {
	h.publish.Write(w)
	h.broker.Write(w)
	h.deliveryLag.Write(w)
	h.ackPhases.Write(w)
	h.unreadPhases.Write(w)
	h.rcptPhases.Write(w)
}
