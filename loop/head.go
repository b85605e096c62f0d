package loop

// headSSE answers HEAD /sse once openSSE's checks of identity, app and
// rooms passed (a refusal is GET's, without its body): the stream's head,
// and the connection closed. No stream opens, and nothing is counted
// against the app's limits.
func (c *conn) headSSE() {
	l := c.l
	s := l.srv
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
