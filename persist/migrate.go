package persist

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// migrationFiles are the schema's versions, NNNN_name.sql, applied in
// order and recorded in schema_migrations. A released file never changes; a
// schema change is a new file.
//
//go:embed migrations/*.sql
var migrationFiles embed.FS

// migrateLockID is the advisory lock that serializes concurrent Migrate
// calls (several nodes started with --migrate at once).
const migrateLockID = 0x726f6f7374 // "roost"

type migration struct {
	version int
	name    string
	sql     string
}

func migrations() ([]migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, fmt.Errorf("cannot read embedded migrations: %w", err)
	}
	var out []migration
	for _, e := range entries {
		num, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			panic("BUG: migration file " + e.Name() + " is not named NNNN_name.sql")
		}
		b, err := migrationFiles.ReadFile("migrations/" + e.Name())
		if err != nil {
			return nil, fmt.Errorf("cannot read migration %s: %w", e.Name(), err)
		}
		out = append(out, migration{version: v, name: e.Name(), sql: string(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	return out, nil
}

// LatestSchema is the schema version this binary needs.
func LatestSchema() int {
	ms, err := migrations()
	if err != nil || len(ms) == 0 {
		panic("BUG: no embedded migrations")
	}
	return ms[len(ms)-1].version
}

// Migrate applies the pending migrations to the database at url in one
// transaction under an advisory lock, so concurrent callers apply each
// version once and a failure leaves the schema as it was.
func Migrate(ctx context.Context, url string) error {
	_, err := MigrateReport(ctx, url)
	return err
}

// Migration is what one Migrate did, for the operator: the schema version
// found, the one left, and the files applied in between, in order.
type Migration struct {
	From, To int
	Applied  []string
}

// MigrateReport is Migrate, saying what it applied.
func MigrateReport(ctx context.Context, url string) (Migration, error) {
	ms, err := migrations()
	if err != nil {
		return Migration{}, err
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return Migration{}, fmt.Errorf("cannot connect to PostgreSQL to migrate (check --database-url): %w", err)
	}
	defer conn.Close(context.Background())
	tx, err := conn.Begin(ctx)
	if err != nil {
		return Migration{}, fmt.Errorf("cannot begin migration: %w", err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // no-op after Commit
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(migrateLockID)); err != nil {
		return Migration{}, fmt.Errorf("cannot take the migration lock: %w", err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
	version    integer PRIMARY KEY,
	name       text NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT now()
)`); err != nil {
		return Migration{}, fmt.Errorf("cannot create schema_migrations: %w", err)
	}
	var current int
	if err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM schema_migrations`).Scan(&current); err != nil {
		return Migration{}, fmt.Errorf("cannot read the schema version: %w", err)
	}
	if latest := ms[len(ms)-1].version; current > latest {
		return Migration{}, fmt.Errorf("cannot migrate: the database schema is version %d, newer than this binary's %d", current, latest)
	}
	rep := Migration{From: current, To: current}
	for _, m := range ms {
		if m.version <= current {
			continue
		}
		// The simple protocol runs a multi-statement file in one call.
		if _, err := tx.Conn().PgConn().Exec(ctx, m.sql).ReadAll(); err != nil {
			return Migration{}, fmt.Errorf("cannot apply migration %s: %w", m.name, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, $2)`, m.version, m.name); err != nil {
			return Migration{}, fmt.Errorf("cannot record migration %s: %w", m.name, err)
		}
		rep.Applied, rep.To = append(rep.Applied, m.name), m.version
	}
	if err := tx.Commit(ctx); err != nil {
		return Migration{}, fmt.Errorf("cannot commit migrations: %w", err)
	}
	return rep, nil
}

// SchemaCurrent reports whether the database has exactly the schema this
// binary needs (serve refuses to start otherwise, unless --migrate).
func (p *Postgres) SchemaCurrent(ctx context.Context) (bool, error) {
	var current int
	err := p.pool.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM schema_migrations`).Scan(&current)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42P01" { // undefined_table: never migrated
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("cannot read the schema version: %w", err)
	}
	return current == LatestSchema(), nil
}
