package main

import (
	"fmt"
	"log/slog"

	"github.com/roost-chat/roost/pubsub"
)

// adminMaxConns bounds the admin listener's connections: a scraper, a
// prober and an operator with pprof need a handful. Past it, the oldest
// idle one gives way to a new one (main_admin.go).
const adminMaxConns = 32

// Descriptors the node needs besides client connections, beyond those
// counted from the configuration: the runtime's poller, log and config
// files, /proc and cgroup reads of tuning, DNS lookups, pprof's files.
const (
	reserveFixed   = 64
	reservePerLoop = 3  // epoll, eventfd, listener
	reserveRedis   = 16 // per seed address: command, subscription and cluster connections
)

// descriptorReserve is what the connection budget leaves free of the
// open-file limit: the PostgreSQL pool, Redis, the admin and API listeners, the
// loops' own descriptors and files.
func descriptorReserve(c *config) int {
	r := reserveFixed + reservePerLoop*c.node.Loops
	if c.databaseURL != "" {
		n := c.pgMaxConns
		if n == 0 {
			n = c.workers + 4
		}
		r += n
	}
	if c.redisURL != "" {
		addrs := 1
		if rc, err := pubsub.ParseRedisURL(c.redisURL); err == nil {
			addrs = len(rc.Addrs)
		}
		r += reserveRedis * addrs
	}
	if c.admin != "off" && c.admin != "" {
		r += adminMaxConns
	}
	if c.api != "off" && c.api != "" {
		// Those held by apps, and as many waiting for their first answer.
		r += 2 * c.apiMaxConns
	}
	return r
}

// connBudget sets c.node.MaxConns from the soft open-file limit when it was
// not given: the limit minus the reserve, so that accept never runs out of
// descriptors (gnet ends every loop when accept fails). A budget given
// above that is kept, with a warning: the operator may know the reserve is
// smaller.
func connBudget(c *config, nofile uint64, nofileErr error, log *slog.Logger) error {
	reserve := descriptorReserve(c)
	if nofileErr != nil || nofile == 0 {
		if c.node.MaxConns == 0 {
			log.Warn("cannot read the open-file limit: no connection budget (set --max-conns)", "err", nofileErr)
		}
		return nil
	}
	room := int(min(nofile, 1<<30)) - reserve
	switch {
	case c.node.MaxConns == 0 && room < 1:
		return fmt.Errorf("open-file limit %d leaves no client connections after a reserve of %d descriptors: raise it (ulimit -n, LimitNOFILE=) or give --max-conns", nofile, reserve)
	case c.node.MaxConns == 0:
		c.node.MaxConns = room
	case c.node.MaxConns > room:
		log.Warn("--max-conns is above what the open-file limit allows after the reserve: accept can run out of descriptors, and the node then exits",
			"max_conns", c.node.MaxConns, "nofile", nofile, "reserve", reserve, "safe_max", room)
	}
	log.Info("connection budget", "max_conns", c.node.MaxConns, "nofile", nofile, "reserve", reserve, "max_conns_per_ip", c.node.MaxConnsPerIP)
	return nil
}
