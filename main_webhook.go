package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/roost-chat/roost/fanout"
	"github.com/roost-chat/roost/fanout/webhook"
	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto"
)

const webhookUsage = `roost webhook: webhook dead letters (PostgreSQL only).

Events a receiver did not take within the app's --webhook-max-age (default
24h) are recorded as dead letters, one per room and batch, and the room's
delivery goes on past them.

Usage:
  roost webhook dead [--app A] [--limit 100]  list dead letters, oldest first, as JSON
  roost webhook replay ID                      POST dead letter ID to its app's webhook again
                                               (signed with the app's current secrets)

Both take --database-url URL (default ROOST_DATABASE_URL or DATABASE_URL).
`

func webhookMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stderr, webhookUsage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("roost webhook "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, webhookUsage+"\nFlags of roost webhook "+sub+":\n")
		fs.PrintDefaults()
	}
	var rf registryFlags
	fs.StringVar(&rf.databaseURL, "database-url", "", "PostgreSQL `url` (default: ROOST_DATABASE_URL or DATABASE_URL)")
	app := fs.String("app", "", "only this app's dead letters (dead)")
	limit := fs.Int("limit", 100, "at most this many dead letters (dead)")
	switch sub {
	case "dead", "replay":
	default:
		fmt.Fprintf(stderr, "roost webhook: unknown command %q\n\n%s", sub, webhookUsage)
		return 2
	}
	pos, err := splitPositional(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	var id int64
	switch {
	case sub == "dead" && len(pos) != 0:
		fmt.Fprintf(stderr, "roost webhook dead: unexpected argument %q\n", pos[0])
		return 2
	case sub == "replay":
		if len(pos) != 1 {
			fmt.Fprintf(stderr, "roost webhook replay: want one dead letter ID, got %d arguments\n", len(pos))
			return 2
		}
		if id, err = strconv.ParseInt(pos[0], 10, 64); err != nil || id <= 0 {
			fmt.Fprintf(stderr, "roost webhook replay: invalid ID %q: want the id of `roost webhook dead`\n", pos[0])
			return 2
		}
	}
	if *limit <= 0 {
		fmt.Fprintln(stderr, "roost webhook dead: invalid --limit: want 1 or more")
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	reg, closeReg, err := rf.open(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "roost webhook %s: %v\n", sub, err)
		return 1
	}
	defer closeReg()
	pg, ok := reg.(*persist.Postgres)
	if !ok {
		fmt.Fprintf(stderr, "roost webhook %s: dead letters live in PostgreSQL: give --database-url\n", sub)
		return 2
	}
	if sub == "dead" {
		dead, err := pg.DeadLetters(ctx, *app, *limit)
		if err != nil {
			fmt.Fprintf(stderr, "roost webhook dead: %v\n", err)
			return 1
		}
		if dead == nil {
			dead = []persist.DeadLetter{}
		}
		if err := printJSON(stdout, dead); err != nil {
			return 1
		}
		return 0
	}
	dl, err := pg.GetDeadLetter(ctx, id)
	if err != nil {
		fmt.Fprintf(stderr, "roost webhook replay: %v\n", err)
		return 1
	}
	apps, err := pg.Apps(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "roost webhook replay: %v\n", err)
		return 1
	}
	for _, a := range apps {
		if a.ID != dl.App {
			continue
		}
		if err := webhook.Replay(ctx, a, dl.Body); err != nil {
			fmt.Fprintf(stderr, "roost webhook replay: cannot POST dead letter %d to app %s's webhook: %v\n", id, a.ID, err)
			return 1
		}
		if err := pg.MarkReplayed(ctx, id); err != nil {
			fmt.Fprintf(stderr, "roost webhook replay: delivered, but %v\n", err)
			return 1
		}
		fmt.Fprintf(stdout, "replayed dead letter %d: %d events of %s/%s, seqs %d to %d\n", id, dl.Events, dl.App, dl.Room, dl.FromSeq, dl.ToSeq)
		return 0
	}
	fmt.Fprintf(stderr, "roost webhook replay: app %s of dead letter %d is not registered\n", dl.App, id)
	return 1
}

// writeDropped writes roost_webhook_dropped_total per app: the events each
// app lost on this node (memory only; with PostgreSQL nothing owed is
// lost). Every app that had a webhook on this node has its series.
func writeDropped(m *expo, hooks *webhook.Dispatcher) {
	type row struct {
		app string
		n   uint64
	}
	var rows []row
	hooks.EachDropped(func(app string, n uint64) { rows = append(rows, row{app, n}) })
	m.family("roost_webhook_dropped_total", "counter")
	slices.SortFunc(rows, func(a, b row) int { return strings.Compare(a.app, b.app) })
	for _, r := range rows {
		m.line(`roost_webhook_dropped_total{app="`+r.app+`"}`, float64(r.n))
	}
}

// writeBacklog writes each app's webhook backlog: events and bytes held,
// rooms left in the store, and the age of the oldest event held.
func writeBacklog(m *expo, hooks *webhook.Dispatcher) {
	var rows []webhook.Backlog
	hooks.EachBacklog(time.Now(), func(b webhook.Backlog) { rows = append(rows, b) })
	slices.SortFunc(rows, func(a, b webhook.Backlog) int { return strings.Compare(a.App, b.App) })
	m.family("roost_webhook_app_owed", "gauge")
	for _, r := range rows {
		m.line(`roost_webhook_app_owed{app="`+labelValue(r.App)+`"}`, float64(r.Owed))
	}
	m.family("roost_webhook_app_held_bytes", "gauge")
	for _, r := range rows {
		m.line(`roost_webhook_app_held_bytes{app="`+labelValue(r.App)+`"}`, float64(r.Bytes))
	}
	m.family("roost_webhook_app_spilled_rooms", "gauge")
	for _, r := range rows {
		m.line(`roost_webhook_app_spilled_rooms{app="`+labelValue(r.App)+`"}`, float64(r.Spill))
	}
	m.family("roost_webhook_app_lag_seconds", "gauge")
	for _, r := range rows {
		m.line(`roost_webhook_app_lag_seconds{app="`+labelValue(r.App)+`"}`, r.Oldest.Seconds())
	}
}

// writeConnEvents writes the connection events' metrics: transitions made
// per type (for apps that want them), committed, dropped, commits failed,
// owed (made and not committed yet), and delivered by the webhooks.
func writeConnEvents(m *expo, fan *fanout.Node, hooks *webhook.Dispatcher) {
	cs := fan.ConnEventStats()
	m.family("roost_conn_events_total", "counter")
	for _, e := range []proto.ConnEvent{proto.EventOnline, proto.EventJoined, proto.EventLeft, proto.EventOffline} {
		m.line(`roost_conn_events_total{type="`+e.String()+`"}`, float64(cs.Made[e].Load()))
	}
	m.counter("roost_conn_events_committed_total", cs.Committed.Load())
	m.counter("roost_conn_events_dropped_total", cs.Dropped.Load())
	m.counter("roost_conn_events_commit_errors_total", cs.Errors.Load())
	m.gauge("roost_conn_events_owed", cs.Owed.Load())
	if hooks != nil {
		m.counter("roost_conn_events_delivered_total", hooks.Stats.ConnSent.Load())
	}
}
