package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/roost-chat/roost/persist"
)

// migrate is `roost migrate`: apply the PostgreSQL schema migrations.
func migrate(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("roost migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("database-url", "", "PostgreSQL `url` (default: ROOST_DATABASE_URL or DATABASE_URL)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "roost migrate: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	for _, name := range envNames("database-url") {
		if v, ok := os.LookupEnv(name); ok && *url == "" {
			*url = v
		}
	}
	if *url == "" {
		fmt.Fprintln(stderr, "roost migrate: no database: give --database-url or DATABASE_URL")
		return 2
	}
	rep, err := persist.MigrateReport(context.Background(), *url)
	if err != nil {
		fmt.Fprintln(stderr, "roost migrate:", err)
		return 1
	}
	printMigration(stderr, rep)
	return 0
}
