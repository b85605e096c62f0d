package loop

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gobwas/ws"
	"github.com/panjf2000/gnet/v2"

	"github.com/roost-chat/roost/fanout"
	"github.com/roost-chat/roost/fanout/proxy"
	"github.com/roost-chat/roost/proto"
)

const (
	stateUpgrading uint8 = iota
	stateOpen
	stateClosing // a close frame is on its way; input is read and dropped (discardInput)
)

// conn is one client connection. Loop only. Kept small: an idle joined
// connection costs this struct, its user id and its room slots (plus gnet's
// own state), no buffers and no goroutine. It fits the heap's 208-byte
// size class (TestConnFitsItsSizeClass); what only some connections need
// lives elsewhere (the source address counted against MaxConnsPerIP in
// loopState.ips, the publish proxy's queue in loopState.pubQueues).
type conn struct {
	m        fanout.Member
	gc       gnet.Conn
	l        *loopState
	app      *app
	au       *appUser // this connection's count and publish bucket in app; nil until admitted
	user     string
	rooms    *roomClaims // the token's rooms and expiry; nil: no token (insecure), every room
	frag     *[]byte     // a fragmented message being assembled, nil otherwise (rare: a pointer keeps conn small)
	opened   int64       // Unix ms
	lastRead int64       // Unix ms of the last input (ticker resolution)
	pos      int32       // index in l.conns
	skip     int32       // closing: payload bytes of the client's current frame still to discard; -1: discard all
	state    uint8
	pinged   bool
	closed   bool
	awaiting bool // the app's connect proxy has not answered yet: input stays unread (proxy.go)
	proxyOK  bool // an SSE request the connect proxy allowed: read again, it is not asked twice
	ppRead   bool // --proxy-protocol: the PROXY header has been read (realaddr.go)
	realSet  bool // the client's address is settled and counted (realaddr.go)
	head     bool // a HEAD request: its answer is GET's without the body
}

// linkOut makes c the owner of its outbound queue and hands the queue to
// its Member, which fanout fills. Once, before any join.
func (c *conn) linkOut() {
	c.m.Out.Owner = c
}

// membersOf appends to dst the members of user "app/user"'s open
// WebSocket connections and SSE streams on loop l: the table's index for read positions
// (fanout.Table.SetUsers). Loop only.
func (l *loopState) membersOf(userKey string, dst []*fanout.Member) []*fanout.Member {
	id, user, _ := strings.Cut(userKey, "/")
	a := l.srv.apps
	a.mu.RLock()
	p := a.byID[id]
	a.mu.RUnlock()
	if p == nil {
		return dst
	}
	p.mu.Lock()
	if u := p.users[user]; u != nil {
		add := func(c *conn) {
			if c.l == l && !c.closed { // c.l first: another loop's conn is not read further
				dst = append(dst, &c.m)
			}
		}
		if u.ws != nil {
			add(u.ws)
		}
		for _, c := range p.moreOf(u) {
			add(c)
		}
	}
	p.mu.Unlock()
	return dst
}

// loopsOf is the set of loops (bit i: loop i) holding an open WebSocket
// connection or SSE stream of user "app/user": the node posts a read position to those
// only (fanout.Node.SetUserLoops). Any goroutine.
func (s *Server) loopsOf(userKey string) uint64 {
	id, user, _ := strings.Cut(userKey, "/")
	a := s.apps
	a.mu.RLock()
	p := a.byID[id]
	a.mu.RUnlock()
	if p == nil {
		return 0
	}
	var mask uint64
	p.mu.Lock()
	if u := p.users[user]; u != nil {
		if u.ws != nil {
			mask |= 1 << u.ws.l.idx
		}
		for _, c := range p.moreOf(u) {
			mask |= 1 << c.l.idx
		}
	}
	p.mu.Unlock()
	return mask
}

// OnOpen registers a new connection with its loop, or closes it at once
// when it is past the connection budget or its address's cap: a refused
// connection costs its descriptor for this call only, and the kernel's
// backlog, not the node, holds whoever waits.
func (s *Server) OnOpen(gc gnet.Conn) ([]byte, gnet.Action) {
	l := s.loopFor(gc.EventLoop())
	s.Stats.Accepted.Add(1)
	if max := s.cfg.MaxConns; max > 0 && s.open.Load() >= int64(max) {
		s.Stats.RefusedBudget.Add(1)
		return nil, gnet.Close
	}
	var ip netip.Addr
	if s.cfg.MaxConnsPerIP > 0 {
		if ip = sourceAddr(gc); s.proxied(ip) {
			ip = netip.Addr{} // a proxy's connection: counted under its client's address (realaddr.go)
		} else if ip.IsValid() && !s.admitIP(ip) {
			s.Stats.RefusedPerIP.Add(1)
			return nil, gnet.Close
		}
	}
	s.open.Add(1)
	now := l.now()
	c := &conn{gc: gc, l: l, opened: now, lastRead: now, pos: int32(len(l.conns))}
	if ip.IsValid() {
		if l.ips == nil {
			l.ips = make(map[*conn]netip.Addr)
		}
		l.ips[c] = ip
	}
	c.linkOut()
	l.conns = append(l.conns, c)
	l.due = append(l.due, c.dueAt())
	l.armSweep()
	gc.SetContext(c)
	s.Stats.Upgrading.Add(1)
	if l.draining {
		return nil, gnet.Close
	}
	return nil, gnet.None
}

// sourceAddr is the connection's peer address (IPv4-mapped ones as IPv4).
func sourceAddr(gc gnet.Conn) netip.Addr {
	ta, ok := gc.RemoteAddr().(*net.TCPAddr)
	if !ok {
		return netip.Addr{}
	}
	a, _ := netip.AddrFromSlice(ta.IP)
	return a.Unmap()
}

// admitIP counts one more connection of ip unless it is at the cap.
// Any loop; accept is not the hot path, one short lock is fine.
func (s *Server) admitIP(ip netip.Addr) bool {
	p := &s.perIP
	p.Lock()
	defer p.Unlock()
	if int(p.n[ip]) >= s.cfg.MaxConnsPerIP {
		return false
	}
	p.n[ip]++
	return true
}

func (s *Server) releaseIP(ip netip.Addr) {
	p := &s.perIP
	p.Lock()
	defer p.Unlock()
	if p.n[ip] <= 1 {
		delete(p.n, ip) // the map holds only addresses with connections
		return
	}
	p.n[ip]--
}

// OnClose forgets a connection: rooms, pending joins, pending output.
func (s *Server) OnClose(gc gnet.Conn, _ error) gnet.Action {
	c, _ := gc.Context().(*conn)
	if c == nil {
		return gnet.None
	}
	l := c.l
	s.open.Add(-1)
	if ip, ok := l.ips[c]; ok {
		delete(l.ips, c)
		s.releaseIP(ip)
	}
	if l.peers != nil {
		delete(l.peers, c)
	}
	if c.m.SSE() {
		s.Stats.SSEConns.Add(-1)
		if c.au != nil { // nil: released when closed over the app's limit (ShedNewest)
			c.app.releaseConn(c)
		}
	} else if c.state == stateUpgrading || c.app == nil {
		// Never upgraded: refused, timed out, or a plain HTTP request.
		s.Stats.Upgrading.Add(-1)
	} else {
		s.Stats.Conns.Add(-1)
		if c.au != nil {
			c.app.releaseConn(c)
		}
	}
	c.closed = true
	c.m.Out.Close()
	l.table.Close(&c.m)
	c.frag = nil
	last := len(l.conns) - 1
	moved := l.conns[last]
	l.conns[c.pos] = moved
	l.due[c.pos] = l.due[last]
	moved.pos = c.pos
	l.conns[last] = nil
	l.conns = l.conns[:last]
	l.due = l.due[:last]
	if last == 0 && l.sweeping && l.sweepT.Stop() {
		l.sweeping = false // no connection left to sweep: no timer either
	}
	gc.SetContext(nil)
	return gnet.None
}

// OnTraffic reads whatever arrived: the upgrade request first, then
// frames. Every complete frame in the buffer is handled in this call
// (gnet calls OnTraffic again only when new bytes arrive, so a frame left
// in the buffer would wait for the peer's next write).
func (s *Server) OnTraffic(gc gnet.Conn) gnet.Action {
	c, _ := gc.Context().(*conn)
	if c == nil || c.closed {
		return gnet.None
	}
	if c.m.SSE() {
		// A listener has nothing to say after its request.
		_, _ = gc.Discard(-1)
		return gnet.None
	}
	c.lastRead = c.l.now()
	c.pinged = false
	if c.state == stateUpgrading {
		if s.cfg.ProxyProtocol && !c.ppRead && !c.proxyHeader() {
			return gnet.None
		}
		if c.awaiting || !c.upgrade() {
			return gnet.None
		}
	}
	c.read()
	c.l.settle()
	c.l.passFresh = false // input was read: a pass in progress may write its next slice
	c.l.kick()
	return gnet.None
}

// maxHeldInput bounds what a connection awaiting its connect proxy's
// answer may send: more is closed with 1008.
const maxHeldInput = 64 << 10

// read handles the frames in gnet's buffer (OnTraffic, and a connection
// whose connect proxy has just allowed it).
func (c *conn) read() {
	gc := c.gc
	buf, _ := gc.Peek(-1)
	used := 0
	for used < len(buf) && c.state == stateOpen && !c.awaiting {
		n := c.frame(buf[used:])
		if n == 0 {
			break
		}
		used += n
	}
	if c.awaiting && c.state == stateOpen && len(buf) > maxHeldInput {
		c.app.refused[RefusedProxy].Add(1)
		c.closeWith(proto.ClosePolicy, []byte("too much input before the connection was accepted"))
	}
	peerClosed := false
	if c.state == stateClosing {
		// The close is under way: what the client sends is read and
		// dropped unprocessed until its close frame (or EOF), so that the
		// socket is never closed on unread input (the kernel would answer
		// with a reset and the client lose the close frame).
		n, pc := c.discardInput(buf[used:])
		used += n
		peerClosed = pc
	}
	if used > 0 {
		_, _ = gc.Discard(used)
	}
	if peerClosed && !c.closed && gc.OutboundBuffered() == 0 {
		// The client answered the close: nothing more will come.
		_ = gc.Close()
	}
	if !c.closed {
		c.l.due[c.pos] = c.dueAt()
	}
	if c.l.refusedFlood {
		// This read drew limit refusals: they leave now, in one write for
		// the whole read, instead of keeping the loop's flush tick armed.
		// A client flooding past its app's rate would otherwise keep the
		// tick running and every other connection of the loop (other
		// apps included) waiting for the tick grid; its answers cost it
		// one write per read of its own instead.
		c.l.refusedFlood = false
		if !c.closed && c.state == stateOpen && c.m.Out.PendingBytes() > 0 && !c.m.Out.Slow() {
			c.l.write(c)
		}
	}
}

// dueAt is when the sweep must next look at c: its upgrade deadline, its
// ping or idle close, or its token expiry, whichever is first (Unix ms).
// Kept in l.due beside l.conns, so that a sweep reads one dense array and
// touches only the connections that are due, not every connection's
// struct each time. Early is harmless (the sweep checks and moves it on),
// late is not: every change of what it depends on refreshes it.
func (c *conn) dueAt() int64 {
	cfg := &c.l.srv.cfg
	switch c.state {
	case stateUpgrading:
		return c.opened + cfg.UpgradeTimeout.Milliseconds()
	case stateOpen:
		if c.m.SSE() {
			return c.sseDueAt()
		}
		d := c.lastRead + cfg.IdleInterval.Milliseconds()
		if c.pinged {
			d += cfg.IdleInterval.Milliseconds()
		}
		if c.rooms != nil && c.rooms.expMS < d {
			d = c.rooms.expMS
		}
		return d
	default:
		return math.MaxInt64 // closing: the client's answer, its EOF or the linger timer ends it
	}
}

// upgrade handles the HTTP request head; it reports whether the
// connection is now a WebSocket and frames may follow in the buffer.
func (c *conn) upgrade() bool {
	l := c.l
	s := l.srv
	buf, _ := c.gc.Peek(-1)
	var req proto.Request
	n, err := proto.ParseRequest(buf, &req)
	if err != nil {
		var he *proto.HTTPError
		if !errors.As(err, &he) {
			he = &proto.HTTPError{Status: 400, Reason: err.Error()}
		}
		c.refuse(he)
		return false
	}
	if n == 0 {
		return false // wait for the rest of the head
	}
	if !c.realSet && s.realLater && !c.settleReal(buf[:n]) {
		return false
	}
	c.head = req.Head
	if string(req.Path) == "/sse" {
		c.openSSE(&req)
		return false
	}
	if string(req.Path) != "/ws" {
		if s.serveHTTP(c, &req) {
			return false
		}
		c.refuse(&proto.HTTPError{Status: 404, Reason: "not found: WebSocket clients connect to /ws"})
		return false
	}
	if !req.Upgrade {
		// Identity first: a browser cannot read why its upgrade was
		// refused, so a client asks the same URL over plain HTTP and gets
		// the 401 and its reason; 426 then means the identity is fine.
		if he := c.identify(&req); he != nil {
			c.refuse(he)
			return false
		}
		c.app = nil // never upgraded: OnClose counts it as such
		c.refuse(&proto.HTTPError{Status: 426, Reason: "upgrade required: /ws speaks WebSocket only"})
		return false
	}
	if he := c.identify(&req); he != nil {
		c.refuse(he)
		return false
	}
	cfg := c.app.cfg.Load()
	switch {
	case cfg == nil: // left the registry since the token was checked
		c.refuse(errUnknown)
		return false
	case cfg.Disabled:
		c.app.refused[RefusedDisabled].Add(1)
		c.refuse(errDisabled)
		return false
	}
	au, limited := c.app.admit(cfg, c.user)
	out := proto.AppendUpgradeResponse(l.scratch[:0], req.Key)
	if s.nodeHeader != nil {
		// The head ends in an empty line: put the node header before it.
		out = append(out[:len(out)-2], s.nodeHeader...)
	}
	l.scratch = out[:0]
	if _, err := c.gc.Write(out); err != nil {
		return false
	}
	_, _ = c.gc.Discard(n)
	c.state = stateOpen
	s.Stats.Upgrading.Add(-1)
	s.Stats.Conns.Add(1)
	if limited != "" {
		// Over a connection limit: the upgrade completes and the close
		// follows at once, so that a browser can read the reason.
		c.closeWith(proto.ClosePolicy, []byte(limited))
		return false
	}
	c.au = au
	c.app.linkWS(c)
	if s.log.Enabled(context.Background(), slog.LevelDebug) {
		// When each client came (and from where) is what a reconnect storm
		// is read from; off by default, so the arguments are built only
		// when asked for.
		s.log.Debug("connection open", "app", c.app.id, "user", c.user, "remote", c.clientAddr())
	}
	if t := cfg.connectProxy; t != nil {
		c.askConnect(t)
	}
	return true
}

// refuse answers an HTTP error and closes.
func (c *conn) refuse(he *proto.HTTPError) {
	c.l.srv.Stats.UpgradeErrors.Add(1)
	out := proto.AppendHTTPError(c.l.scratch[:0], he)
	c.l.scratch = out[:0]
	if c.head {
		out = out[:len(out)-len(he.Reason)-1] // GET's head, without the reason after it
	}
	_, _ = c.gc.Write(out)
	c.state = stateClosing
	_ = c.gc.Close()
}

// upgradeTimeout: a client that sent part of a head gets 400, one that sent
// nothing is just closed.
func (c *conn) upgradeTimeout() {
	if c.gc.InboundBuffered() > 0 {
		c.refuse(&proto.HTTPError{Status: 400, Reason: "request head not completed in time"})
		return
	}
	c.state = stateClosing
	_ = c.gc.Close()
}

// frame handles one frame at the start of b and returns its length, or 0
// when b does not hold a whole frame yet (or the connection is closing).
func (c *conn) frame(b []byte) int {
	s := c.l.srv
	h, hn, err := proto.ParseFrameHeader(b)
	if err != nil {
		c.closeWith(proto.CloseProtocolError, []byte("malformed frame"))
		return 0
	}
	if hn == 0 {
		return 0
	}
	if !h.Masked {
		c.closeWith(proto.CloseProtocolError, []byte("client frames must be masked"))
		return 0
	}
	if h.Length > int64(s.cfg.MaxFrame) || (h.OpCode == ws.OpContinuation && c.frag != nil && int64(len(*c.frag))+h.Length > int64(s.cfg.MaxFrame)) {
		c.closeWith(proto.CloseTooBig, []byte("frame too large"))
		return 0
	}
	total := hn + int(h.Length)
	if len(b) < total {
		return 0
	}
	payload := b[hn:total]
	proto.Unmask(payload, h.Mask)
	s.Stats.FramesIn.Add(1)
	switch h.OpCode {
	case ws.OpText:
		if c.frag != nil {
			c.closeWith(proto.CloseProtocolError, []byte("new message inside a fragmented one"))
			return 0
		}
		if !h.Fin {
			buf := append(make([]byte, 0, min(int(h.Length)*2, s.cfg.MaxFrame)), payload...)
			c.frag = &buf
			return total
		}
		c.message(payload)
	case ws.OpContinuation:
		if c.frag == nil {
			c.closeWith(proto.CloseProtocolError, []byte("continuation without a message"))
			return 0
		}
		*c.frag = append(*c.frag, payload...)
		if h.Fin {
			msg := *c.frag
			c.frag = nil
			c.message(msg)
		}
	case ws.OpBinary:
		c.closeWith(proto.CloseUnsupported, []byte("binary frames are not supported"))
		return 0
	case ws.OpPing:
		f := c.l.arena.Space(len(payload) + 2)
		c.send(c.l.arena.Keep(proto.AppendControlFrame(f, ws.OpPong, payload)))
	case ws.OpPong:
	case ws.OpClose:
		c.peerClose(payload)
		return 0
	default:
		c.closeWith(proto.CloseProtocolError, []byte("unknown opcode"))
		return 0
	}
	if c.state != stateOpen {
		return 0
	}
	return total
}

// discardInput skips the frames of a closing connection without looking
// at their payloads, and reports how much of b it used and whether the
// client's close frame came. A header cut at the end of b stays in gnet's
// buffer (at most 14 bytes); a payload cut there is counted in c.skip.
// Input that does not parse as frames, or a frame past MaxFrame, is
// dropped whole until the client goes or the linger runs out.
func (c *conn) discardInput(b []byte) (int, bool) {
	used := 0
	for used < len(b) {
		if c.skip < 0 {
			return len(b), false
		}
		if c.skip > 0 {
			n := min(int(c.skip), len(b)-used)
			used += n
			c.skip -= int32(n)
			continue
		}
		h, hn, err := proto.ParseFrameHeader(b[used:])
		switch {
		case err != nil || h.Length > int64(c.l.srv.cfg.MaxFrame) || h.Length > math.MaxInt32:
			c.skip = -1
			continue
		case hn == 0:
			return used, false
		case h.OpCode == ws.OpClose:
			return len(b), true
		}
		used += hn
		c.skip = int32(h.Length)
	}
	return used, false
}

// peerClose answers a client's close frame with the same code (RFC 6455 5.5.1).
func (c *conn) peerClose(p []byte) {
	switch {
	case len(p) == 0:
		c.closeWith(proto.CloseNormal, nil)
	case len(p) == 1:
		c.closeWith(proto.CloseProtocolError, []byte("bad close frame"))
	case !utf8.Valid(p[2:]):
		c.closeWith(proto.CloseInvalidData, []byte("close reason not UTF-8"))
	default:
		code := int(binary.BigEndian.Uint16(p))
		if !validCloseCode(code) {
			c.closeWith(proto.CloseProtocolError, []byte("bad close code"))
			return
		}
		c.closeWith(code, nil)
	}
}

func validCloseCode(code int) bool {
	switch {
	case code >= 3000 && code <= 4999:
		return true
	case code >= 1000 && code <= 1014:
		return code != 1004 && code != 1005 && code != 1006
	}
	return false
}

// message handles one complete text message.
func (c *conn) message(p []byte) {
	if !utf8.Valid(p) {
		c.closeWith(proto.CloseInvalidData, []byte("text frame is not valid UTF-8"))
		return
	}
	l := c.l
	cmd := &l.cmd
	err := proto.Decode(p, cmd)
	if err != nil {
		if err == proto.ErrMalformed {
			c.closeWith(proto.CloseInvalidData, []byte("frame is not a JSON object"))
			return
		}
		var pe *proto.Error
		if errors.As(err, &pe) {
			c.sendErr(proto.Ref(cmd), pe.Code, pe.Message)
		} else {
			c.sendErr(proto.Ref(cmd), proto.CodeBadRequest, err.Error())
		}
		return
	}
	switch cmd.Op {
	case proto.OpPing:
		c.send(pongFrame)
	case proto.OpJoin:
		c.join(cmd)
	case proto.OpLeave:
		c.leave(cmd)
	case proto.OpPub:
		c.pub(cmd)
	case proto.OpHistory:
		c.history(cmd)
	case proto.OpAuth:
		c.refresh(cmd.Token)
	case proto.OpPresence:
		c.presence(cmd)
	case proto.OpSignal:
		c.signal(cmd)
	case proto.OpRead:
		c.markRead(cmd)
	case proto.OpUnread:
		c.unread(cmd)
	case proto.OpReceipts:
		c.receipts(cmd)
	}
}

// send queues a frame for this connection (written when the loop's wake-up
// ends, or at the next tick if one is running).
func (c *conn) send(frame []byte) {
	c.l.q.Enqueue(&c.m.Out, frame)
}

// sendErr queues an err frame.
func (c *conn) sendErr(ref []byte, code proto.Code, msg string) {
	a := c.l.arena
	c.send(a.Keep(proto.AppendErrFrame(a.Space(64+6*len(ref)+2*len(msg)), ref, code, msg)))
}

// closeWith flushes what is pending, sends a close frame and starts the
// closing handshake (RFC 6455 7.1.1). The close frame goes behind the
// pending frames so nothing acknowledged to the client is cut off
// mid-stream (a slow consumer's were dropped before: its close frame
// follows at most the one frame gnet holds). From then on the client's
// input is read and dropped, never processed (discardInput); once the
// close frame has left, the write side is shut (FIN after it), and the
// socket is closed when the client's close frame or EOF arrives, or after
// lingerMax (lingerClose). Closing at once would throw the frame away:
// with the client's input unread, or arriving after the close, the kernel
// answers with a reset, the client's stack discards what it had not read,
// and the client sees 1006 without its code and retry hint.
func (c *conn) closeWith(code int, reason []byte) {
	if c.m.SSE() {
		c.endSSE() // a stream has no close frame: its retry field says when to come back
		return
	}
	if c.closed || c.state == stateClosing {
		return
	}
	l := c.l
	if c.m.Out.PendingBytes() > 0 && !c.m.Out.Slow() {
		l.writeOut(c, true)
		if c.closed || c.state == stateClosing {
			return
		}
	}
	l.q.Drop(&c.m.Out)
	f := proto.AppendCloseFrame(l.arena.Space(2+125+14), uint16(code), string(reason))
	_, _ = c.gc.Write(f)
	c.closing()
	if !c.closed {
		l.lingerClose(c)
	}
}

// closing marks the connection as on its way out: nothing more is queued
// for it, so no frame can follow its close frame.
func (c *conn) closing() {
	c.state = stateClosing
	c.m.Out.Close()
}

// fail closes after a write error: the peer is gone, nothing to say.
func (c *conn) fail() {
	if c.closed || c.state == stateClosing {
		return
	}
	c.closing()
	_ = c.gc.Close()
}

// Write hands the pending frames to the kernel (fanout.Owner).
func (c *conn) Write() { c.l.write(c) }

// Resync closes with 1013 and a jittered retry hint (fanout.Owner): the
// client rejoins with since, here or on another node.
func (c *conn) Resync() { c.closeWith(proto.CloseTryAgain, c.l.retryReason()) }

// User is the connection's user id (fanout.Owner).
func (c *conn) User() string { return c.user }

// Buffered is what gnet holds of earlier writes (fanout.Owner).
func (c *conn) Buffered() int {
	if c.closed {
		return 0
	}
	return c.gc.OutboundBuffered()
}

var _ fanout.Owner = (*conn)(nil)

func (c *conn) join(cmd *proto.Command) {
	l := c.l
	if msg := c.mayRead(cmd.Room); msg != "" {
		c.sendErr(cmd.Room, proto.CodeForbidden, msg)
		return
	}
	if !c.admitJoin() {
		c.sendErr(cmd.Room, proto.CodeForbidden, "room limit of this connection reached")
		return
	}
	rs := fanout.Resume{Since: cmd.Since, HasSince: cmd.HasSince, Epoch: cmd.Epoch, HasEpoch: cmd.HasEpoch, Presence: cmd.Presence}
	if cmd.Presence {
		rs.MaxPresence = int(l.srv.cfg.Limits.MaxPresence)
		if cfg := c.app.cfg.Load(); cfg != nil {
			rs.MaxPresence = cfg.MaxPresence
		}
	}
	switch err := l.table.Join(&c.m, l.roomKey(c, cmd.Room), rs); err {
	case nil:
		if cmd.NoEcho || c.m.EchoOff() {
			l.table.SetEcho(&c.m, l.intern(l.roomKey(c, cmd.Room)), !cmd.NoEcho)
		}
		if cmd.Receipts {
			l.table.SetReceipts(&c.m, l.intern(l.roomKey(c, cmd.Room)), true)
		}
	case fanout.ErrJoined:
		c.sendErr(cmd.Room, proto.CodeBadRequest, err.Error())
	case fanout.ErrPresenceLimit:
		c.app.refused[RefusedPresenceLimit].Add(1)
		c.sendErr(cmd.Room, proto.CodeForbidden, err.Error())
	default:
		c.sendErr(cmd.Room, proto.CodeForbidden, err.Error())
	}
}

// presence answers who is in the room, on every node: read off the loop,
// in turn with the connection's history requests.
func (c *conn) presence(cmd *proto.Command) {
	l := c.l
	if msg := c.mayRead(cmd.Room); msg != "" {
		c.sendErr(cmd.Room, proto.CodeForbidden, msg)
		return
	}
	if err := l.table.Presence(&c.m, l.intern(l.roomKey(c, cmd.Room))); err != nil {
		c.sendErr(cmd.Room, proto.CodeRateLimited, err.Error())
	}
}

func (c *conn) leave(cmd *proto.Command) {
	l := c.l
	l.table.Leave(&c.m, l.roomKey(c, cmd.Room))
	a := l.arena
	c.send(a.Keep(proto.AppendLeftFrame(a.Space(32+len(cmd.Room)), cmd.Room)))
}

func (c *conn) pub(cmd *proto.Command) {
	l := c.l
	if msg := c.mayWrite(cmd.Room); msg != "" {
		c.sendErr(cmd.ID, proto.CodeForbidden, msg)
		return
	}
	if l.draining {
		c.sendErr(cmd.ID, proto.CodeOverloaded, "node is draining: publish elsewhere")
		return
	}
	if l.inboxFull() {
		l.srv.Stats.Overloaded.Add(1)
		l.srv.Stats.InboxFull.Add(1)
		c.sendErr(cmd.ID, proto.CodeOverloaded, "node overloaded: retry later with the same id")
		return
	}
	if l.shedding() {
		l.srv.Stats.Overloaded.Add(1)
		l.srv.Stats.Shed.Add(1)
		c.sendErr(cmd.ID, proto.CodeOverloaded, "node overloaded: retry later with the same id")
		return
	}
	// Limits last: a publish refused for overload spends no rate credit.
	if !c.admitPub(cmd) {
		return
	}
	req := fanout.GetPubRequest()
	req.Key = l.intern(l.roomKey(c, cmd.Room))
	req.From = c.user
	req.ID = append(req.ID[:0], cmd.ID...)
	req.Body = append(req.Body[:0], cmd.Body...)
	req.Kind, req.Ref = cmd.Kind, cmd.Ref
	if cfg := c.app.cfg.Load(); cfg != nil && cfg.publishProxy != nil || len(l.pubQueues) > 0 && l.pubQueues[c] != nil {
		// Slow path: the app's backend decides first, and what waits for
		// it keeps this connection's later publishes behind it.
		var t *proxy.Target
		if cfg != nil {
			t = cfg.publishProxy
		}
		c.askPublish(t, cmd.Room, req)
		return
	}
	c.publish(req)
}

// publish hands req, a publish of c, to the publish path. Loop only.
func (c *conn) publish(req *fanout.PubRequest) {
	l := c.l
	ps := l.stamp(c, req)
	req.Origin = ps
	req.Tag = l.table.PubTag(&c.m)
	c.m.Published(req.Key, req.ID)
	l.srv.Stats.Publishes.Add(1)
	if err := l.srv.fan.Publish(req); err != nil {
		l.unstamp(ps, false)
		l.srv.Stats.Overloaded.Add(1)
		// Answered and forgotten before req goes back to the pool, which
		// empties its ID: an err without the id is a refusal the client
		// cannot match to its publish, so it never sends it again (the
		// capacity run's burst: 44,129 refused, none retried).
		c.m.Acked(req.Key, req.ID, 0)
		c.sendErr(req.ID, proto.CodeOverloaded, "publish queue full: retry later")
		fanout.PutPubRequest(req)
	}
}

// ack answers a publish once it is committed (or failed).
func (l *loopState) ack(ps *pubStamp) {
	c, req, seq, err := ps.c, ps.req, ps.seq, ps.err
	waited := l.unstamp(ps, true)
	defer fanout.PutPubRequest(req)
	if c.closed || c.state != stateOpen {
		return
	}
	room := roomName(req.Key)
	a := l.arena
	if err != nil {
		c.m.Acked(req.Key, req.ID, 0)
		code, msg := proto.CodeOverloaded, "not stored: retry with the same id"
		var pe *proto.Error
		switch {
		case errors.As(err, &pe):
			// A rule of the kinds (ref not found, not the sender's).
			code, msg = pe.Code, pe.Message
		case errors.Is(err, proto.ErrRoomLimit):
			code, msg = proto.CodeForbidden, "not stored: the app has its maximum of rooms"
		case !errors.Is(err, proto.ErrOverloaded) && !errors.Is(err, proto.ErrClosed):
			code, msg = proto.CodeInternal, "not stored: internal error"
		}
		c.sendErr(req.ID, code, msg)
		return
	}
	c.m.Acked(req.Key, req.ID, seq)
	l.srv.Stats.Acks.Add(1)
	l.srv.Stats.AckLatency.Observe(waited.Seconds())
	now := fanout.Stamp()
	if req.Answered != 0 {
		l.srv.Stats.AckInbox.Observe((now - req.Answered).Seconds())
	}
	c.send(a.Keep(proto.AppendAckFrame(a.Space(64+6*len(req.ID)+len(room)), req.ID, room, seq)))
	if len(l.acksOut) < maxAcksOut {
		l.acksOut = append(l.acksOut, ackOut{c: c, at: now})
	}
}

// maxAcksOut bounds the acks a loop tracks until written (writeAcks,
// ackWritten walk them after every round of writes): publishers that do
// not read their socket must not make every flush slower. Past it an ack
// leaves with its connection's next write, unobserved.
const maxAcksOut = 4096

// ackOut is an ack queued on c at (fanout.Stamp) and not written yet.
type ackOut struct {
	c  *conn
	at time.Duration
}

// ackWritten observes the write-out of the acks whose connections have
// nothing pending any more (written, or closed) and forgets them. Loop
// only; after each round of writes.
func (l *loopState) ackWritten() {
	if len(l.acksOut) == 0 {
		return
	}
	now := fanout.Stamp()
	keep := l.acksOut[:0]
	for _, a := range l.acksOut {
		switch {
		case a.c.closed:
		case a.c.m.Out.PendingBytes() == 0:
			l.srv.Stats.AckWrite.Observe((now - a.at).Seconds())
		default:
			keep = append(keep, a)
		}
	}
	clear(l.acksOut[len(keep):])
	l.acksOut = keep
}

func (c *conn) history(cmd *proto.Command) {
	l := c.l
	if msg := c.mayRead(cmd.Room); msg != "" {
		c.sendErr(cmd.Room, proto.CodeForbidden, msg)
		return
	}
	key := l.intern(l.roomKey(c, cmd.Room))
	before := uint64(0) // the store reads 0 as "no bound"
	if cmd.HasBefore {
		// before is exclusive and seqs start at 1: before 0 asks for
		// nothing older than 0, which is what before 1 gets. It still
		// waits its turn, so that answers keep the order of requests.
		before = max(cmd.Before, 1)
	}
	q := fanout.HistoryQuery{Before: before, After: cmd.After, Forward: cmd.HasAfter, Fold: cmd.Fold, Limit: cmd.Limit}
	if err := l.table.Query(&c.m, key, q); err != nil {
		c.sendErr(cmd.Room, proto.CodeRateLimited, err.Error())
	}
}
