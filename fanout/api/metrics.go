package api

import (
	"fmt"
	"io"

	vm "github.com/VictoriaMetrics/metrics"
)

// RegisterMetrics adds the server API's series to set, read from Stats
// and EdgeStats at scrape time: requests by route and answer, publishes,
// disconnects, the listener's budget (who holds its connections, and
// what it refused or pushed out), and the publishes' latency histogram.
func (s *Server) RegisterMetrics(set *vm.Set) {
	set.RegisterMetricsWriter(s.writeMetrics)
}

func (s *Server) writeMetrics(w io.Writer) {
	as := &s.Stats
	vm.WriteMetadataIfNeeded(w, "roost_api_requests_total", "counter")
	for r, route := range RouteNames {
		for k, code := range CodeNames {
			fmt.Fprintf(w, "roost_api_requests_total{route=\"%s\",code=\"%s\"} %d\n", route, code, as.Requests[r][k].Load())
		}
	}
	vm.WriteCounterUint64(w, "roost_api_published_total", as.Published.Load())
	vm.WriteCounterUint64(w, "roost_api_publish_duplicates_total", as.Duplicates.Load())
	vm.WriteCounterUint64(w, "roost_api_disconnected_total", as.Disconnected.Load())

	es := &s.EdgeStats
	gauge := func(name string, v int64) {
		vm.WriteMetadataIfNeeded(w, name, "gauge")
		fmt.Fprintf(w, "%s %d\n", name, v)
	}
	gauge("roost_api_connections_held", es.Bound.Load())
	limited := es.AddrLimited.Load() // first: the other counts it after
	if ls := s.ListenerStats(); ls != nil {
		gauge("roost_api_connections_waiting", ls.Counted.Load())
		vm.WriteCounterUint64(w, "roost_api_connections_evicted_total", ls.Evicted.Load())
		vm.WriteCounterUint64(w, "roost_api_connections_busy_total", ls.Refused.Load())
	}
	vm.WriteMetadataIfNeeded(w, "roost_api_refused_total", "counter")
	for _, r := range []struct {
		reason string
		n      uint64
	}{
		{"no_valid_secret", es.Unauthenticated.Load() - limited},
		{"address_rate", limited},
		{"app_conns", es.AppConnsFull.Load()},
		{"node_conns", es.NodeConnsFull.Load()},
		{"app_inflight", es.AppInFlightFull.Load()},
	} {
		fmt.Fprintf(w, "roost_api_refused_total{reason=\"%s\"} %d\n", r.reason, r.n)
	}
	// App ids are [A-Za-z0-9_.-] (proto.ValidAppID), which %q writes as
	// they are. A family's series follow its metadata together: one pass each.
	vm.WriteMetadataIfNeeded(w, "roost_api_app_connections", "gauge")
	s.AppBudgets(func(app string, conns, _ int64) {
		fmt.Fprintf(w, "roost_api_app_connections{app=%q} %d\n", app, conns)
	})
	vm.WriteMetadataIfNeeded(w, "roost_api_app_inflight", "gauge")
	s.AppBudgets(func(app string, _, inflight int64) {
		fmt.Fprintf(w, "roost_api_app_inflight{app=%q} %d\n", app, inflight)
	})
	s.pubLa.Write(w)
}
