package loop

import (
	"time"

	"github.com/roost-chat/roost/fanout"
	"github.com/roost-chat/roost/fanout/proxy"
	"github.com/roost-chat/roost/proto"
)

// The proxy hooks (docs/protocol.md, Proxy hooks) on the loop side. The
// loop never waits for a backend: it hands the question to the proxy pool
// and goes on; the answer comes back as a tProxy task in its inbox.
//
// Connect (WebSocket): the upgrade completes (so that a browser can read a refusal's
// reason in the close frame), and the connection is awaiting: what it
// sends stays unread in gnet's buffer, up to maxHeldInput, until the
// answer. Allowed, the held frames are read then, in order; refused, the
// connection is closed with 1008 and the backend's message (1013 and a
// retry hint when the backend did not answer and the app fails closed).
// An SSE request waits for the answer before its response: refused, it
// gets 403 with the backend's message (503 when the backend did not
// answer), which fetch-based clients can read.
//
// Publish: each publish of a connection waits in the connection's queue
// (pubQueue) in the order read, and its question goes out at once, so
// that several are asked at a time; answers may come back in any order,
// and a publish leaves the queue, into fanout.Node.Publish or as an err
// frame, only once those before it have left. One connection's publishes
// thus keep their order, and a slow answer holds the later ones behind it.

// maxProxyQueue bounds the publishes of one connection waiting for the
// publish proxy; past it a publish is refused with overloaded.
const maxProxyQueue = 64

// proxyWait is one question of a connection: its connect, or one of its
// publishes (req set).
type proxyWait struct {
	call     proxy.Call
	c        *conn
	req      *fanout.PubRequest // publish: what goes to fanout when allowed
	answered bool               // loop only: the tProxy task has run
}

// pubQueue is a connection's publishes waiting for the publish proxy, in
// the order read: in loopState.pubQueues while it holds any.
type pubQueue struct {
	q []*proxyWait
}

// answered hands a call's answer to its connection's loop. A pool worker
// calls it (proxy.Call.Done).
func answered(call *proxy.Call) {
	w := call.Ref.(*proxyWait)
	w.c.l.push(task{kind: tProxy, px: w})
}

// askConnect asks the app's connect proxy about c, which has just been
// upgraded and admitted. Loop only.
func (c *conn) askConnect(t *proxy.Target) {
	w := &proxyWait{c: c}
	w.call = proxy.Call{Kind: proxy.Connect, App: c.app.id, User: c.user, Client: c.clientAddr(), Done: answered, Ref: w}
	c.awaiting = true
	if !c.l.srv.proxy.Ask(&w.call, *t) {
		c.l.proxied(w) // answered at once (queue full): the fail mode
	}
}

// askPublish queues req, a publish of c that passed every check of the
// loop, behind c's earlier publishes and asks the app's publish proxy
// about it (t nil: the proxy was removed while publishes were waiting;
// req only keeps its place in the order). Loop only.
func (c *conn) askPublish(t *proxy.Target, room []byte, req *fanout.PubRequest) {
	l := c.l
	pq := l.pubQueues[c]
	if pq == nil {
		if l.pubQueues == nil {
			l.pubQueues = make(map[*conn]*pubQueue)
		}
		pq = &pubQueue{}
		l.pubQueues[c] = pq
	}
	if len(pq.q) >= maxProxyQueue {
		c.l.srv.Stats.Overloaded.Add(1)
		c.sendErr(req.ID, proto.CodeOverloaded, "too many publishes waiting for the app's publish check: retry later with the same id")
		fanout.PutPubRequest(req)
		return
	}
	w := &proxyWait{c: c, req: req}
	pq.q = append(pq.q, w)
	if t == nil {
		w.call.Allow, w.answered = true, true
		c.releasePublishes()
		return
	}
	w.call = proxy.Call{Kind: proxy.Publish, App: c.app.id, User: c.user, Room: string(room), ID: string(req.ID),
		Body: req.Body, Client: c.clientAddr(), Done: answered, Ref: w}
	if !c.l.srv.proxy.Ask(&w.call, *t) {
		w.answered = true
		c.releasePublishes()
		return
	}
	l.proxyPubs++
}

// proxied acts on an answer. Loop only.
func (l *loopState) proxied(w *proxyWait) {
	c := w.c
	if w.req != nil {
		l.proxyPubs--
		l.proxyAt = time.Since(monoEpoch)
		w.answered = true
		c.releasePublishes()
		return
	}
	if !c.awaiting {
		return
	}
	c.awaiting = false
	if c.closed {
		return
	}
	if c.state == stateUpgrading {
		// An SSE request: its head is still in gnet's buffer.
		if !w.call.Allow {
			c.app.refused[RefusedProxy].Add(1)
			he := &proto.HTTPError{Status: 503, Reason: w.call.Message}
			if w.call.Result == proxy.Denied {
				he.Status = 403
			}
			c.refuseSSE(he)
			return
		}
		c.proxyOK = true
		c.upgrade()
		return
	}
	if c.state != stateOpen {
		return
	}
	if !w.call.Allow {
		c.app.refused[RefusedProxy].Add(1)
		if w.call.Result == proxy.Denied {
			c.closeWith(proto.ClosePolicy, []byte(w.call.Message))
		} else {
			c.closeWith(proto.CloseTryAgain, l.retryReason())
		}
		return
	}
	// Accepted: what the client sent meanwhile is read now.
	c.read()
}

// releasePublishes hands the answered publishes at the head of c's queue
// on: allowed ones into the publish path, refused ones back as err frames
// with the publish's id. Loop only.
func (c *conn) releasePublishes() {
	pq := c.l.pubQueues[c]
	n := 0
	for n < len(pq.q) && pq.q[n].answered {
		w := pq.q[n]
		pq.q[n] = nil
		n++
		if c.closed || c.state != stateOpen {
			fanout.PutPubRequest(w.req)
			continue
		}
		if w.call.Allow {
			c.publish(w.req)
			continue
		}
		c.app.refused[RefusedProxy].Add(1)
		c.sendErr(w.req.ID, w.call.Code, w.call.Message)
		fanout.PutPubRequest(w.req)
	}
	if n > 0 {
		rest := copy(pq.q, pq.q[n:])
		clear(pq.q[rest:])
		pq.q = pq.q[:rest]
	}
	if len(pq.q) == 0 {
		// Every answer of a closed connection comes back (within its
		// timeout), so its entry goes too.
		delete(c.l.pubQueues, c)
	}
}
