package loop

import "github.com/roost-chat/roost/proto"

// headSSE answers HEAD /sse as GET /sse would begin: the same checks of
// identity, app and rooms (the same refusals, without their bodies), then
// the stream's head, and the connection closed. No stream opens: the
// connect proxy is not asked and nothing is counted against the app's
// limits.
func (c *conn) headSSE(req *proto.Request) {
	l := c.l
	s := l.srv
	if he := c.identify(req); he != nil {
		c.refuseSSE(he)
		return
	}
	cfg := c.app.cfg.Load()
	switch {
	case cfg == nil:
		c.refuseSSE(errUnknown)
		return
	case cfg.disabled:
		c.refuseSSE(errDisabled)
		return
	}
	rooms, he := l.sseRooms(req.Query, cfg.maxRooms)
	if he != nil {
		c.refuseSSE(he)
		return
	}
	for _, r := range rooms {
		if !c.rooms.allows(l.sseBuf[r.start:r.end]) {
			c.refuseSSE(errSSEForbidden)
			return
		}
	}
	c.app = nil // never opened: OnClose counts it as never upgraded
	out := append(l.scratch[:0], sseHead...)
	if s.nodeHeader != nil {
		out = append(out, s.nodeHeader...) // ends the head with the empty line
	} else {
		out = append(out, "\r\n"...)
	}
	l.scratch = out[:0]
	_, _ = c.gc.Write(out)
	c.state = stateClosing
	_ = c.gc.Close()
}
