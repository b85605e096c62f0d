package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/roost-chat/roost/fanout/webhook"
	"github.com/roost-chat/roost/persist"
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
