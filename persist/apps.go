package persist

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/roost-chat/roost/proto"
)

// Registry errors.
var (
	ErrAppExists = errors.New("app already exists")
	ErrNoApp     = errors.New("no such app")
)

// Registry is where apps are registered: the apps table of PostgreSQL, or
// a JSON file (--apps FILE) for nodes without a database. Every method may
// be called from any goroutine, and by several processes at once (the
// `roost app` commands while nodes serve).
type Registry interface {
	// Apps returns every registered app, ordered by id.
	Apps(ctx context.Context) ([]proto.App, error)
	// CreateApp registers a new app; ErrAppExists if the id is taken.
	CreateApp(ctx context.Context, a proto.App) error
	// UpdateApp changes an app under a lock held against other writers:
	// fn edits a copy, which is validated and stored when fn returns nil.
	// ErrNoApp if id is not registered.
	UpdateApp(ctx context.Context, id string, fn func(*proto.App) error) (proto.App, error)
	// WatchApps calls fn with the whole registry after every change (and,
	// as a safety net, every interval) until ctx is done. A read that
	// fails is logged and fn keeps the last good registry.
	WatchApps(ctx context.Context, every time.Duration, fn func([]proto.App), log *slog.Logger)
	// Reload asks a running WatchApps to re-read now (SIGHUP).
	Reload()
}

var (
	_ Registry = (*Postgres)(nil)
	_ Registry = (*AppFile)(nil)
)

const appColumns = `id, secret, coalesce(previous_secret, ''), previous_until, disabled, limits,
	coalesce((extract(epoch FROM max_age) * 1000)::int8, 0), coalesce(max_count, 0), created_at, settings, identity`

// appSettings is the settings column: what an app configures beyond its
// limits.
type appSettings struct {
	Webhook *proto.Webhook `json:"webhook,omitempty"`
	Proxy   *proto.Proxy   `json:"proxy,omitempty"`
}

func scanApp(row pgx.Row) (proto.App, error) {
	var a proto.App
	var until *time.Time
	var limits []byte
	var ageMS int64
	var settings, identity []byte
	if err := row.Scan(&a.ID, &a.Secret, &a.PreviousSecret, &until, &a.Disabled, &limits, &ageMS, &a.KeepCount, &a.Created, &settings, &identity); err != nil {
		return a, err
	}
	if identity != nil {
		a.Identity = new(proto.Identity)
		if err := json.Unmarshal(identity, a.Identity); err != nil {
			return a, fmt.Errorf("app %s: cannot read its identity settings: %w", a.ID, err)
		}
	}
	var st appSettings
	if err := json.Unmarshal(settings, &st); err != nil {
		return a, fmt.Errorf("app %s: cannot read its settings: %w", a.ID, err)
	}
	a.Webhook, a.Proxy = st.Webhook, st.Proxy
	if until != nil {
		a.PreviousUntil = *until
	}
	a.KeepAge = proto.Duration(time.Duration(ageMS) * time.Millisecond)
	if err := json.Unmarshal(limits, &a.Limits); err != nil {
		return a, fmt.Errorf("app %s: cannot read its limits: %w", a.ID, err)
	}
	return a, nil
}

// Apps returns the registered apps: rows with a secret. Rows without one
// were made by a first publish (insecure mode, --app-secret).
func (p *Postgres) Apps(ctx context.Context) ([]proto.App, error) {
	rows, err := p.pool.Query(ctx, `SELECT `+appColumns+` FROM apps WHERE secret IS NOT NULL ORDER BY id`)
	if err != nil {
		return nil, p.wrap("read the app registry", err)
	}
	defer rows.Close()
	var out []proto.App
	for rows.Next() {
		a, err := scanApp(rows)
		if err != nil {
			return nil, p.wrap("read the app registry", err)
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, p.wrap("read the app registry", err)
	}
	return out, nil
}

// appArgs are the stored columns of a, in the order of the statements below.
func appArgs(a *proto.App) ([]any, error) {
	limits, err := json.Marshal(&a.Limits)
	if err != nil {
		return nil, err
	}
	var until *time.Time
	var prev *string
	if a.PreviousSecret != "" {
		prev, until = &a.PreviousSecret, &a.PreviousUntil
	}
	var age *string
	if a.KeepAge > 0 {
		s := fmt.Sprintf("%d milliseconds", time.Duration(a.KeepAge).Milliseconds())
		age = &s
	}
	var count *int32
	if a.KeepCount > 0 {
		c := int32(min(a.KeepCount, 1<<31-1))
		count = &c
	}
	settings, err := json.Marshal(&appSettings{Webhook: a.Webhook, Proxy: a.Proxy})
	if err != nil {
		return nil, err
	}
	var identity []byte // NULL: none
	if a.Identity != nil {
		if identity, err = json.Marshal(a.Identity); err != nil {
			return nil, err
		}
	}
	return []any{a.ID, a.Secret, prev, until, a.Disabled, limits, age, count, settings, identity}, nil
}

// CreateApp registers a; an existing row without a secret (made on first
// use) becomes registered and keeps its rooms and messages.
func (p *Postgres) CreateApp(ctx context.Context, a proto.App) error {
	if err := a.Validate(); err != nil {
		return err
	}
	args, err := appArgs(&a)
	if err != nil {
		return err
	}
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		return p.wrap("create app", err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // no-op after Commit
	tag, err := tx.Exec(ctx, `
INSERT INTO apps (id, secret, previous_secret, previous_until, disabled, limits, max_age, max_count, settings, identity)
VALUES ($1, $2, $3, $4, $5, $6, $7::interval, $8, $9, $10)
ON CONFLICT (id) DO UPDATE SET secret = EXCLUDED.secret, previous_secret = EXCLUDED.previous_secret,
	previous_until = EXCLUDED.previous_until, disabled = EXCLUDED.disabled, limits = EXCLUDED.limits,
	max_age = EXCLUDED.max_age, max_count = EXCLUDED.max_count, settings = EXCLUDED.settings, identity = EXCLUDED.identity, updated_at = now()
WHERE apps.secret IS NULL`, args...)
	if err != nil {
		return p.wrap("create app", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("cannot create app %s: %w", a.ID, ErrAppExists)
	}
	// Rooms made on first use before the app was registered owe nothing
	// from before its webhook.
	if err := startHookCursors(ctx, tx, a.ID, nil, a.Webhook); err != nil {
		return p.wrap("create app", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return p.wrap("create app", err)
	}
	return nil
}

// UpdateApp edits a registered app inside a transaction holding its row
// lock, so two concurrent `roost app` commands do not lose an edit.
func (p *Postgres) UpdateApp(ctx context.Context, id string, fn func(*proto.App) error) (proto.App, error) {
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		return proto.App{}, p.wrap("update app", err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // no-op after Commit
	a, err := scanApp(tx.QueryRow(ctx, `SELECT `+appColumns+` FROM apps WHERE id = $1 AND secret IS NOT NULL FOR UPDATE`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return proto.App{}, fmt.Errorf("cannot update app %s: %w", id, ErrNoApp)
	}
	if err != nil {
		return proto.App{}, p.wrap("update app", err)
	}
	var before *proto.Webhook
	if a.Webhook != nil {
		w := *a.Webhook
		before = &w
	}
	if err := fn(&a); err != nil {
		return proto.App{}, err
	}
	a.ID = id
	if err := a.Validate(); err != nil {
		return proto.App{}, err
	}
	args, err := appArgs(&a)
	if err != nil {
		return proto.App{}, err
	}
	if _, err := tx.Exec(ctx, `
UPDATE apps SET secret = $2, previous_secret = $3, previous_until = $4, disabled = $5, limits = $6,
	max_age = $7::interval, max_count = $8, settings = $9, identity = $10, updated_at = now()
WHERE id = $1`, args...); err != nil {
		return proto.App{}, p.wrap("update app", err)
	}
	if err := startHookCursors(ctx, tx, id, before, a.Webhook); err != nil {
		return proto.App{}, p.wrap("update app", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return proto.App{}, p.wrap("update app", err)
	}
	return a, nil
}

// WatchApps listens for the registry's notifications on a connection of its
// own (outside the pool, which the publish workers need) and re-reads the
// whole registry after each one, and every interval in case a notification
// was lost with its connection. A read that failed is tried again sooner
// than a whole interval later (retryAppsRead): when PostgreSQL restarts, the
// pool's recently used connections die with the listener's, and the first
// read after the new LISTEN meets one of them.
func (p *Postgres) WatchApps(ctx context.Context, every time.Duration, fn func([]proto.App), log *slog.Logger) {
	if p.reloadApps == nil {
		panic("BUG: persist: WatchApps on a Postgres not made by OpenPostgres")
	}
	go func() {
		var failing bool
		read := func() {
			apps, err := p.Apps(ctx)
			if err != nil {
				if ctx.Err() == nil && !failing {
					log.Warn("cannot read the app registry; keeping the last one", "err", err)
				}
				failing = true
				return
			}
			if failing {
				log.Info("app registry readable again", "apps", len(apps))
			}
			failing = false
			fn(apps)
		}
		// next is how long to wait for a notification before reading anyway:
		// after failed reads, a backoff from retryAppsRead up to every, so
		// that a fleet does not hammer a PostgreSQL that is coming back.
		retry := retryAppsRead
		next := func() time.Duration { return appsReadWait(failing, &retry, every) }
		for ctx.Err() == nil {
			conn, err := pgx.ConnectConfig(ctx, p.pool.Config().ConnConfig.Copy())
			if err == nil {
				if _, err = conn.Exec(ctx, `LISTEN roost_apps`); err != nil {
					conn.Close(context.Background())
				}
			}
			if err != nil {
				// No listener: poll until one can be made again.
				if ctx.Err() == nil && !failing {
					log.Warn("cannot listen for app registry changes; re-reading it every interval", "every", every, "err", err)
				}
				read()
				select {
				case <-ctx.Done():
				case <-time.After(next()):
				case <-p.reloadApps:
				}
				continue
			}
			read()
			for ctx.Err() == nil {
				wctx, cancel := context.WithTimeout(ctx, next())
				waited := make(chan struct{})
				go func() {
					select {
					case <-p.reloadApps:
						cancel()
					case <-waited:
					}
				}()
				_, err := conn.WaitForNotification(wctx)
				close(waited)
				cancel()
				if ctx.Err() != nil {
					break
				}
				if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
					break // the connection died: make a new one
				}
				read()
			}
			conn.Close(context.Background())
		}
	}()
}

// appsReadWait is how long WatchApps waits before reading the registry
// anyway: every while reads succeed; after failed ones retry, which
// doubles up to every.
func appsReadWait(failing bool, retry *time.Duration, every time.Duration) time.Duration {
	if !failing {
		*retry = retryAppsRead
		return every
	}
	d := min(every, *retry)
	// Doubled only up to every: past the largest Duration it would turn
	// negative, and a negative wait reads (and dials) in a busy loop.
	*retry = min(every, 2**retry)
	return d
}

// retryAppsRead is how soon WatchApps first reads the registry again after
// a read failed.
const retryAppsRead = 200 * time.Millisecond

// Reload makes WatchApps re-read the registry now.
func (p *Postgres) Reload() {
	select {
	case p.reloadApps <- struct{}{}:
	default:
	}
}
