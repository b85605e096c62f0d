package persist

import (
	"fmt"
	"io"

	"github.com/VictoriaMetrics/metrics"
	"github.com/jackc/pgx/v5/pgxpool"
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
// the rooms refused by an app's room limit, the commits' retries, rechecks
// and commits in doubt, and the connection pool's use.
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
		writePool(w, p.pool.Stat())
	})
}

// writePool writes the connection pool's use: how often a commit or a
// read found every connection taken and how long such waits summed, which
// a store read's time on the node (roost_unread_phase_seconds' store
// phase) includes and PostgreSQL's own statement time does not.
func writePool(w io.Writer, st *pgxpool.Stat) {
	metrics.WriteCounterUint64(w, "roost_store_pool_acquires_total", uint64(st.AcquireCount()))
	metrics.WriteCounterUint64(w, "roost_store_pool_empty_acquires_total", uint64(st.EmptyAcquireCount()))
	metrics.WriteCounterFloat64(w, "roost_store_pool_empty_acquire_wait_seconds_total", st.EmptyAcquireWaitTime().Seconds())
	metrics.WriteMetadataIfNeeded(w, "roost_store_pool_conns", "gauge")
	fmt.Fprintf(w, "roost_store_pool_conns{state=\"acquired\"} %d\n", st.AcquiredConns())
	fmt.Fprintf(w, "roost_store_pool_conns{state=\"idle\"} %d\n", st.IdleConns())
	writeGauge(w, "roost_store_pool_max_conns", int64(st.MaxConns()))
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
