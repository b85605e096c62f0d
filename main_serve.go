package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/roost-chat/roost/fanout/api"
	"github.com/roost-chat/roost/loop"
	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto"
)

// The pieces serve builds that want a word of their own.

func newLogger(c *config, w io.Writer) *slog.Logger {
	var lv slog.Level
	_ = lv.UnmarshalText([]byte(c.logLevel))
	opts := &slog.HandlerOptions{Level: lv}
	if c.logFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// newAPIServer serves the server API on ln: timeouts sized for backends,
// a bound on request heads (bodies are bounded per request by the app's
// max-msg), and connections held only by apps that gave a valid secret,
// each within its budget (fanout/api/edge.go).
func newAPIServer(s *api.Server, ln net.Listener, log *slog.Logger) (*http.Server, net.Listener) {
	return s.NewHTTPServer(ln, slog.NewLogLogger(log.Handler(), slog.LevelDebug))
}

// onControl acts on a control message from the broker: a disconnect
// closes the user's connections on this node. It runs on the broker's
// goroutine, so the close (which waits for the loops) runs on its own.
func onControl(srv *loop.Server, msg []byte, log *slog.Logger) {
	var c proto.Control
	if err := proto.ParseControl(msg, &c); err != nil {
		log.Warn("malformed control message on the broker", "len", len(msg))
		return
	}
	if srv != nil {
		go srv.Disconnect(c.App, c.User, 2*time.Second)
	}
}

// openStore opens the store the configuration names and adds it to stops:
// PostgreSQL (migrated first with --migrate; its schema must be current)
// or memory. pg is the store when it is PostgreSQL.
func openStore(ctx context.Context, c *config, log *slog.Logger, stops *stopList) (store persist.Store, pg *persist.Postgres, err error) {
	if c.databaseURL == "" {
		mem := persist.NewMemory(c.keep)
		stops.add("store", mem.Close)
		mem.SetRetentionPolicy(c.retention)
		mem.SetLimits(c.memStoreMaxN, c.maxAppRooms)
		mem.StartRetention(ctx, c.retInterval)
		return mem, nil, nil
	}
	if c.migrate {
		rep, err := persist.MigrateReport(ctx, c.databaseURL)
		if err != nil {
			return nil, nil, err
		}
		log.Info("schema migrated", "from", rep.From, "to", rep.To, "applied", rep.Applied)
	}
	pg, err = persist.OpenPostgres(ctx, c.databaseURL, persist.PGConfig{MaxConns: int32(pgMaxConns(c)), StatementTimeout: c.stmtTimeout, MaxAppRooms: c.maxAppRooms, Logger: log})
	if err != nil {
		return nil, nil, err
	}
	stops.add("store", pg.Close)
	ok, err := pg.SchemaCurrent(ctx)
	if err != nil {
		return nil, nil, err
	}
	if !ok {
		return nil, nil, errors.New("database schema is missing or outdated: run `roost migrate` or start with --migrate")
	}
	pg.SetRetentionPolicy(c.retention)
	pg.StartRetention(ctx, c.retInterval)
	return pg, pg, nil
}
