package proxy

import (
	"fmt"
	"io"

	vm "github.com/VictoriaMetrics/metrics"
)

// RegisterMetrics adds roost_proxy_calls_total{kind,result} to set, read
// from Stats at scrape time (every kind and result has its series, asked
// or not), and the calls' histogram roost_proxy_call_seconds.
func (p *Pool) RegisterMetrics(set *vm.Set) {
	set.RegisterMetricsWriter(func(w io.Writer) {
		vm.WriteMetadataIfNeeded(w, "roost_proxy_calls_total", "counter")
		for k, kind := range KindNames {
			for r, result := range ResultNames {
				fmt.Fprintf(w, "roost_proxy_calls_total{kind=\"%s\",result=\"%s\"} %d\n", kind, result, p.Stats.Calls[k][r].Load())
			}
		}
		p.latency.Write(w)
	})
}
