package webhook

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	vm "github.com/VictoriaMetrics/metrics"
)

// RegisterMetrics adds the webhooks' series to set, read from Stats and
// the apps' queues at scrape time: events taken, delivered, dropped (per
// app) and dead; POSTs; each app's backlog and lag; and the delivery lag
// histogram roost_webhook_lag_seconds.
func (d *Dispatcher) RegisterMetrics(set *vm.Set) {
	set.RegisterMetricsWriter(d.writeMetrics)
}

func (d *Dispatcher) writeMetrics(w io.Writer) {
	ws := &d.Stats
	vm.WriteCounterUint64(w, "roost_webhook_events_total", ws.Queued.Load())
	vm.WriteCounterUint64(w, "roost_webhook_delivered_total", ws.Delivered.Load())
	vm.WriteCounterUint64(w, "roost_webhook_posts_total", ws.Posts.Load())
	vm.WriteCounterUint64(w, "roost_webhook_failures_total", ws.Failures.Load())
	d.writeDropped(w)
	d.writeBacklog(w)
	vm.WriteCounterUint64(w, "roost_webhook_dead_total", ws.Dead.Load())
	vm.WriteCounterUint64(w, "roost_webhook_read_total", ws.Read.Load())
	vm.WriteCounterUint64(w, "roost_conn_events_delivered_total", ws.ConnSent.Load())
	for _, g := range []struct {
		name string
		v    int64
	}{{"roost_webhook_owed", ws.Owed.Load()}, {"roost_webhook_held_bytes", ws.Held.Load()}} {
		vm.WriteMetadataIfNeeded(w, g.name, "gauge")
		fmt.Fprintf(w, "%s %d\n", g.name, g.v)
	}
	d.lag.Write(w)
}

// writeDropped writes roost_webhook_dropped_total per app: the events each
// app lost on this node (memory only; with PostgreSQL nothing owed is
// lost). Every app that had a webhook on this node has its series.
func (d *Dispatcher) writeDropped(w io.Writer) {
	type row struct {
		app string
		n   uint64
	}
	var rows []row
	d.EachDropped(func(app string, n uint64) { rows = append(rows, row{app, n}) })
	vm.WriteMetadataIfNeeded(w, "roost_webhook_dropped_total", "counter")
	slices.SortFunc(rows, func(a, b row) int { return strings.Compare(a.app, b.app) })
	for _, r := range rows {
		fmt.Fprintf(w, "roost_webhook_dropped_total{app=%q} %d\n", r.app, r.n)
	}
}

// writeBacklog writes each app's webhook backlog: events and bytes held,
// rooms left in the store, and the age of the oldest event held.
func (d *Dispatcher) writeBacklog(w io.Writer) {
	var rows []Backlog
	d.EachBacklog(time.Now(), func(b Backlog) { rows = append(rows, b) })
	slices.SortFunc(rows, func(a, b Backlog) int { return strings.Compare(a.App, b.App) })
	vm.WriteMetadataIfNeeded(w, "roost_webhook_app_owed", "gauge")
	for _, r := range rows {
		fmt.Fprintf(w, "roost_webhook_app_owed{app=%q} %d\n", r.App, r.Owed)
	}
	vm.WriteMetadataIfNeeded(w, "roost_webhook_app_held_bytes", "gauge")
	for _, r := range rows {
		fmt.Fprintf(w, "roost_webhook_app_held_bytes{app=%q} %d\n", r.App, r.Bytes)
	}
	vm.WriteMetadataIfNeeded(w, "roost_webhook_app_spilled_rooms", "gauge")
	for _, r := range rows {
		fmt.Fprintf(w, "roost_webhook_app_spilled_rooms{app=%q} %d\n", r.App, r.Spill)
	}
	vm.WriteMetadataIfNeeded(w, "roost_webhook_app_lag_seconds", "gauge")
	for _, r := range rows {
		fmt.Fprintf(w, "roost_webhook_app_lag_seconds{app=%q} %s\n", r.App, formatSeconds(r.Oldest))
	}
}

// formatSeconds writes whole values without an exponent, as the other
// series are.
func formatSeconds(d time.Duration) string {
	v := d.Seconds()
	if v == math.Trunc(v) && math.Abs(v) < 1<<53 {
		return strconv.FormatInt(int64(v), 10)
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}
