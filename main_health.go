package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

// healthMain is `roost health`: GET /healthz (or /readyz with --ready) on
// the node's admin listener, exit 0 when it answers 200. A container's
// HEALTHCHECK runs it: the image has no shell and no curl, only roost.
func healthMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("roost health", flag.ContinueOnError)
	fs.SetOutput(stderr)
	admin := fs.String("admin", "", "the node's admin listener `host:port` (default: ROOST_ADMIN, else 127.0.0.1:6060)")
	ready := fs.Bool("ready", false, "ask /readyz (fit for new clients) instead of /healthz (alive)")
	timeout := fs.Duration("timeout", 3*time.Second, "how long to wait for the answer")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *admin == "" {
		*admin = os.Getenv("ROOST_ADMIN")
	}
	if *admin == "" {
		*admin = "127.0.0.1:6060"
	}
	if *admin == "off" {
		fmt.Fprintln(stderr, "roost health: the admin listener is off (--admin off): nothing to ask")
		return 2
	}
	host, port, err := net.SplitHostPort(*admin)
	if err != nil {
		fmt.Fprintf(stderr, "roost health: invalid --admin %q: want host:port\n", *admin)
		return 2
	}
	// A listener on every address is reached on loopback.
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	path := "/healthz"
	if *ready {
		path = "/readyz"
	}
	url := "http://" + net.JoinHostPort(host, port) + path
	resp, err := (&http.Client{Timeout: *timeout}).Get(url)
	if err != nil {
		fmt.Fprintln(stderr, "roost health:", err)
		return 1
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	fmt.Fprintln(stdout, strings.TrimSpace(string(b)))
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintln(stderr, "roost health:", url, "answered", resp.Status)
		return 1
	}
	return 0
}
