//go:build !linux

package bench

import (
	"fmt"
	"io"
)

// Main is Linux's only: the load generator drives its sockets with epoll,
// SO_TIMESTAMPNS and IP_BIND_ADDRESS_NO_PORT, and reads /proc for the
// node's CPU, so bench builds on Linux alone (the files carry
// //go:build linux) and this says so elsewhere.
func Main(args []string, stdout, stderr io.Writer) int {
	fmt.Fprintln(stderr, "roost bench: runs on Linux only (epoll, Linux socket options and /proc)")
	return 2
}
