package main

import (
	"fmt"
	"io"
	"log/slog"
	"net"
)

// devBanner tells a newcomer who ran `go run .` where to go next: the
// demo page, a client URL and a server API call that work as printed in
// development mode. Written as plain lines (a text log would quote and
// escape the curl command); with --log-format json, as one log record.
func devBanner(w io.Writer, log *slog.Logger, jsonLogs bool, addr, apiAddr string, apiDev bool) {
	demo := "http://" + addr + "/"
	ws := "ws://" + addr + "/ws?user=alice&app=demo"
	var curl string
	if apiDev {
		curl = `curl -d '{"id":"k-1","from":"bot","body":"hi"}' http://` + apiAddr + `/v1/apps/demo/rooms/lobby/messages`
	}
	if jsonLogs {
		log.Info("development mode", "demo", demo, "client", ws, "server_api", curl)
		return
	}
	fmt.Fprintf(w, "\nroost is in development mode (no apps configured, loopback only):\n")
	fmt.Fprintf(w, "  demo page   %s  (open it in two browser windows)\n", demo)
	fmt.Fprintf(w, "  a client    %s\n", ws)
	if curl != "" {
		fmt.Fprintf(w, "  server API  %s\n", curl)
		fmt.Fprintf(w, "              (no secret in development mode; with apps configured, add -H \"Authorization: Bearer $SECRET\")\n")
	}
	fmt.Fprintf(w, "  production  roost app create, roost token, roost tune: see README.md\n\n")
}

// loopbackAddr: addr (host:port) listens on loopback only.
func loopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
