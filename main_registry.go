package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/roost-chat/roost/fanout/api"
	"github.com/roost-chat/roost/fanout/tenancy"
	"github.com/roost-chat/roost/fanout/webhook"
	"github.com/roost-chat/roost/loop"
	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto"
)

// registryName says where the registry is, for the log.
func registryName(c *config) string {
	if c.appsFile != "" {
		return "file " + c.appsFile
	}
	return "postgresql"
}

// registryRetention is the apps' own retention (keep_age, keep_count) by
// app, for those that have one.
func registryRetention(apps []proto.App) map[string]persist.Retention {
	out := map[string]persist.Retention{}
	for i := range apps {
		if a := &apps[i]; a.KeepAge > 0 || a.KeepCount > 0 {
			out[a.ID] = persist.Retention{MaxAge: time.Duration(a.KeepAge), MaxCount: a.KeepCount}
		}
	}
	return out
}

// startRegistry reads the app registry (the --apps file, or PostgreSQL's
// apps table) once, hands it to every part that serves apps, and watches
// it until ctx ends: changes reach this node within 2 s (LISTEN/NOTIFY or
// the file's mtime at once, the periodic re-read at worst). Each reading
// is resolved once, into one tenancy.Snapshot that the loops (WebSocket,
// SSE) and the server API are both handed: the two edges hold the same
// views of every app. Without a registry the snapshot holds the
// --app-secret apps alone, and it returns a nil Registry.
func startRegistry(ctx context.Context, c *config, log *slog.Logger, store persist.Store, pg *persist.Postgres, srv *loop.Server, hooks *webhook.Dispatcher, apiSrv *api.Server) (persist.Registry, error) {
	share := func(apps []proto.App) {
		snap := tenancy.NewSnapshot(c.node.AppLimits(), c.node.Apps, apps)
		srv.SetApps(snap)
		if apiSrv != nil {
			apiSrv.SetApps(snap)
		}
	}
	var reg persist.Registry
	switch {
	case c.appsFile != "":
		reg = persist.OpenAppFile(c.appsFile)
	case pg != nil:
		reg = pg
	default:
		share(nil)
		return nil, nil
	}
	// A registry in PostgreSQL keeps the apps' retention in the columns the
	// store's retention reads; a file's reaches the store from here.
	fileRetention, _ := store.(interface {
		SetAppRetention(map[string]persist.Retention)
	})
	if c.appsFile == "" {
		fileRetention = nil
	}
	regLog := newRegistryLog(log)
	setApps := func(apps []proto.App) {
		regLog.applied(apps)
		share(apps)
		hooks.SetApps(apps)
		if fileRetention != nil {
			fileRetention.SetAppRetention(registryRetention(apps))
		}
	}
	t0 := time.Now()
	apps, err := reg.Apps(ctx)
	if err != nil {
		return nil, err
	}
	setApps(apps)
	reg.WatchApps(ctx, time.Second, setApps, log)
	if len(apps) == 0 && len(c.node.Apps) == 0 && !c.node.Insecure {
		log.Warn("the app registry is empty: every client is refused until `roost app create ID` registers an app")
	}
	log.Info("app registry", "apps", len(apps), "where", registryName(c), "took", time.Since(t0))
	return reg, nil
}
