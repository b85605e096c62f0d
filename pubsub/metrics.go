package pubsub

import (
	"fmt"
	"io"

	"github.com/VictoriaMetrics/metrics"
)

// RegisterMetrics adds the Redis broker's series to set, read from its
// counters at scrape time: publishes, messages received, resubscriptions
// and the rooms subscribed or waiting for their subscription.
func (r *Redis) RegisterMetrics(set *metrics.Set) {
	set.RegisterMetricsWriter(func(w io.Writer) {
		rs := r.Stats()
		metrics.WriteCounterUint64(w, "roost_redis_published_total", rs.Published)
		metrics.WriteCounterUint64(w, "roost_redis_publish_errors_total", rs.PublishErrors)
		metrics.WriteCounterUint64(w, "roost_redis_received_total", rs.Received)
		metrics.WriteCounterUint64(w, "roost_redis_malformed_total", rs.Malformed)
		metrics.WriteCounterUint64(w, "roost_redis_resubscribes_total", rs.Resubscribes)
		metrics.WriteCounterUint64(w, "roost_redis_subscribe_errors_total", rs.SubscribeErrors)
		for _, g := range []struct {
			name string
			v    int64
		}{{"roost_redis_subscribed_rooms", rs.Subscribed}, {"roost_redis_pending_rooms", rs.Pending}} {
			metrics.WriteMetadataIfNeeded(w, g.name, "gauge")
			fmt.Fprintf(w, "%s %d\n", g.name, g.v)
		}
	})
}
