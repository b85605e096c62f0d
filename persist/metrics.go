package persist

import (
	"fmt"
	"io"

	"github.com/VictoriaMetrics/metrics"
)

// RegisterMetrics adds the memory store's series to set: retention, the
// byte budget and the rooms refused by an app's room limit.
func (m *Memory) RegisterMetrics(set *metrics.Set) {
	set.RegisterMetricsWriter(func(w io.Writer) {
		writeRetention(w, m.RetentionStats())
		ms := m.Stats()
		writeGauge(w, "roost_memory_store_bytes", ms.Bytes)
		writeGauge(w, "roost_memory_store_max_bytes", ms.MaxBytes)
		metrics.WriteCounterUint64(w, "roost_memory_store_evicted_total", ms.Evicted)
		metrics.WriteCounterUint64(w, "roost_rooms_refused_total", ms.RoomsRefused)
	})
}

// RegisterMetrics adds the PostgreSQL store's series to set: retention,
// the rooms refused by an app's room limit and the commits' retries,
// rechecks and commits in doubt.
func (p *Postgres) RegisterMetrics(set *metrics.Set) {
	set.RegisterMetricsWriter(func(w io.Writer) {
		writeRetention(w, p.RetentionStats())
		metrics.WriteCounterUint64(w, "roost_rooms_refused_total", p.RoomsRefused())
		cs := p.CommitStats()
		metrics.WriteCounterUint64(w, "roost_store_deadlocks_total", cs.Deadlocks)
		metrics.WriteCounterUint64(w, "roost_store_commit_retries_total", cs.Retries)
		metrics.WriteCounterUint64(w, "roost_store_commit_rechecks_total", cs.Rechecks)
		metrics.WriteMetadataIfNeeded(w, "roost_store_commits_in_doubt_total", "counter")
		fmt.Fprintf(w, "roost_store_commits_in_doubt_total{outcome=\"committed\"} %d\n", cs.ResolvedCommitted)
		fmt.Fprintf(w, "roost_store_commits_in_doubt_total{outcome=\"rolled_back\"} %d\n", cs.ResolvedRolledBack)
		fmt.Fprintf(w, "roost_store_commits_in_doubt_total{outcome=\"unknown\"} %d\n", cs.Unresolved)
	})
}

func writeRetention(w io.Writer, rs RetentionStats) {
	metrics.WriteMetadataIfNeeded(w, "roost_retention_deleted_total", "counter")
	fmt.Fprintf(w, "roost_retention_deleted_total{rule=\"age\"} %d\n", rs.DeletedByAge)
	fmt.Fprintf(w, "roost_retention_deleted_total{rule=\"count\"} %d\n", rs.DeletedByCount)
	metrics.WriteCounterUint64(w, "roost_retention_runs_total", rs.Runs)
	metrics.WriteCounterUint64(w, "roost_retention_errors_total", rs.Errors)
}

func writeGauge(w io.Writer, name string, v int64) {
	metrics.WriteMetadataIfNeeded(w, name, "gauge")
	fmt.Fprintf(w, "%s %d\n", name, v)
}
