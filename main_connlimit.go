package main

import (
	"cmp"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"log/slog"
	"slices"
	"time"

	"github.com/roost-chat/roost/loop"
	"github.com/roost-chat/roost/pubsub"
)

// shareConnsEvery is how often nodes share their connection counts through
// Redis: the app connection limit holds across the cluster within what the
// other nodes admit in one period, and an excess is closed within about
// two (docs/operations.md).
const shareConnsEvery = 500 * time.Millisecond

// shareConns keeps every app's count of connections on the other nodes
// current, for the cluster-wide --app-max-conns, and closes this node's
// share of an app's excess over it: nodes admitting at once each see the
// others' counts of the last period, so together they can admit more than
// the limit. Each node closes its share of the excess, newest first, as
// computed from the shared counts (shedShare), so that the cluster ends
// at the limit without closing more than the excess.
func shareConns(ctx context.Context, r *pubsub.Redis, srv *loop.Server, log *slog.Logger) {
	t := time.NewTicker(shareConnsEvery)
	defer t.Stop()
	var failing bool
	// The counts are keyed by process, not by node id: two nodes given the
	// same --node-id (or both on port 0 in tests) must not overwrite each
	// other's count. A restarted node's old entry expires with its TTL.
	var rnd [6]byte
	_, _ = crand.Read(rnd[:])
	instance := srv.NodeID() + "/" + hex.EncodeToString(rnd[:])
	// shed: per app, the connections this node closed over the limit since
	// the cluster was last seen within it.
	shed := map[string]int64{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		mine := map[string]pubsub.ConnCount{}
		srv.AppConns(func(app string, n int64) {
			if n > 0 || shed[app] > 0 {
				mine[app] = pubsub.ConnCount{Conns: n, Shed: shed[app]}
			}
		})
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		others, err := r.ShareConns(cctx, instance, mine, 6*shareConnsEvery)
		cancel()
		if err != nil {
			if !failing && ctx.Err() == nil {
				log.Warn("cannot share connection counts through Redis; app connection limits use the last counts shared meanwhile", "err", err)
			}
			failing = true
			continue
		}
		failing = false
		srv.AppConns(func(app string, _ int64) {
			var sum int64
			for _, counts := range others {
				sum += counts[app].Conns
			}
			srv.SetRemoteConns(app, sum)
		})
		for app, me := range mine {
			nodes := map[string]pubsub.ConnCount{instance: me}
			for node, counts := range others {
				if n, ok := counts[app]; ok {
					nodes[node] = n
				}
			}
			k, over := shedShare(srv.AppMaxConns(app), instance, nodes)
			if !over {
				delete(shed, app)
				continue
			}
			if k > 0 {
				closed := srv.ShedNewest(app, int(k), time.Second)
				shed[app] += int64(closed)
				log.Info("closed connections over the app's cluster-wide limit", "app", app, "closed", closed, "share", k, "limit", srv.AppMaxConns(app))
			}
		}
	}
}

// shedShare is how many connections of one app the node self closes, from
// every live node's figures (self's included): over reports whether the
// cluster holds more than limit (0: none). The excess is divided over the
// nodes in proportion to what each held before closing any (Conns+Shed),
// by largest remainder with ties to the lower node name, so that every
// node computes the same shares from the same figures, and a node that
// closed its share first leaves the others' shares as they were. A node
// closes what its share still lacks, and never more than the current
// excess.
func shedShare(limit int64, self string, nodes map[string]pubsub.ConnCount) (k int64, over bool) {
	if limit <= 0 {
		return 0, false
	}
	var conns, base int64
	for _, n := range nodes {
		conns += n.Conns
		base += n.Conns + n.Shed
	}
	excess := conns - limit
	if excess <= 0 {
		return 0, false
	}
	toShed := base - limit // >= excess
	type share struct {
		name    string
		q, frac int64
	}
	shares := make([]share, 0, len(nodes))
	var given int64
	for name, n := range nodes {
		b := n.Conns + n.Shed
		s := share{name: name, q: toShed * b / base, frac: toShed * b % base}
		given += s.q
		shares = append(shares, s)
	}
	slices.SortFunc(shares, func(a, b share) int {
		if c := cmp.Compare(b.frac, a.frac); c != 0 {
			return c
		}
		return cmp.Compare(a.name, b.name)
	})
	for i := int64(0); i < toShed-given; i++ {
		shares[i].q++
	}
	for _, s := range shares {
		if s.name == self {
			me := nodes[self]
			return max(0, min(s.q-me.Shed, excess, me.Conns)), true
		}
	}
	return 0, true
}
