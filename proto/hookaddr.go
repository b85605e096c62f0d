package proto

import (
	"fmt"
	"net/netip"
	"net/url"
	"strings"
)

// ForbiddenHookAddr says why a hook (webhook, proxy hook) may never call
// ip, or "": link-local addresses, where cloud metadata services answer
// (169.254.169.254) with the machine's credentials. Loopback and private
// addresses are allowed: a backend is often on the same host or network.
func ForbiddenHookAddr(ip netip.Addr) string {
	ip = ip.Unmap()
	if ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() {
		if ip.Is4() {
			return "a link-local address (169.254.0.0/16: cloud metadata services)"
		}
		return "a link-local address (fe80::/10)"
	}
	if ip == ec2MetadataV6 {
		return "a cloud metadata address (fd00:ec2::254)"
	}
	return ""
}

// ec2MetadataV6 is the one metadata address outside link-local.
var ec2MetadataV6 = netip.MustParseAddr("fd00:ec2::254")

// checkHookHost refuses a hook URL whose host is a forbidden literal
// address (a name is checked on what it resolves to, when the node calls).
func checkHookHost(what string, u *url.URL) error {
	h := u.Hostname()
	if i := strings.IndexByte(h, '%'); i >= 0 {
		h = h[:i] // fe80::1%eth0
	}
	ip, err := netip.ParseAddr(h)
	if err != nil {
		return nil
	}
	if why := ForbiddenHookAddr(ip); why != "" {
		return fmt.Errorf("%s url %q: %s is %s, which a hook may not call", what, u.String(), u.Hostname(), why)
	}
	return nil
}
