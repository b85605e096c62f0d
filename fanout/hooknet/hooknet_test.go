package hooknet

import (
	"errors"
	"net"
	"testing"
)

// TestControl: link-local and metadata addresses are refused; so is an
// address reaching one of the node's listeners, every local address for
// one on 0.0.0.0 or ::; loopback and private backends on other ports pass.
func TestControl(t *testing.T) {
	g := &Guard{}
	defer g.Own("admin", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 6060})()
	rm := g.Own("client", &net.TCPAddr{IP: net.IPv4zero, Port: 8080})
	defer rm()
	g.Own("api", &net.TCPAddr{IP: net.IPv6unspecified, Port: 8090})()
	cases := []struct {
		addr    string
		refused bool
	}{
		{"169.254.169.254:80", true},
		{"[fe80::1]:80", true},
		{"[::ffff:169.254.1.1]:80", true},
		{"[fd00:ec2::254]:80", true},
		{"127.0.0.1:6060", true},
		{"0.0.0.0:6060", true},
		{"127.0.0.1:8080", true},
		{"127.0.0.2:8080", true},
		{"[::1]:8080", true},
		{"127.0.0.1:8090", false}, // that listener was removed
		{"127.0.0.1:6061", false},
		{"10.1.2.3:6060", false},
		{"192.168.1.5:443", false},
		{"[::1]:9000", false},
	}
	for _, c := range cases {
		err := g.Control("tcp", c.addr, nil)
		if got := errors.Is(err, ErrRefused); got != c.refused {
			t.Errorf("%s: refused %v (%v), want %v", c.addr, got, err, c.refused)
		}
	}
	// A listener on 0.0.0.0 owns its port on the host's own addresses.
	as, _ := net.InterfaceAddrs()
	for _, a := range as {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() {
			if err := g.Control("tcp", net.JoinHostPort(ipn.IP.String(), "8080"), nil); !errors.Is(err, ErrRefused) {
				t.Errorf("%s:8080 (a local address): %v, want refused", ipn.IP, err)
			}
		}
	}
}
