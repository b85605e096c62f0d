package fanout

import (
	"context"
	"math/rand/v2"

	"github.com/roost-chat/roost/proto"
	"github.com/roost-chat/roost/pubsub"
)

// Signals (typing, cursors) travel like messages, one frame encoded once
// by the sending node and carried by the broker to every node holding the
// room, but nothing is committed: no seq, no store, no history, no
// webhook. At most once: a signal the broker or a loop cannot take now is
// dropped, never retried.
//
// The broker carries (key, seq, frame); a signal is told apart by the top
// bit of its seq, which no message reaches (seqs count a room's messages
// from 1). The rest of the seq names the sending member: 31 random bits of
// the sending node and 32 of a counter, so that the sender's own
// connection is left out on its node while the user's other connections
// (other tabs, other nodes) still get it.

// signalBit marks a broker seq as a signal's sender tag.
const signalBit = 1 << 63

// signalQueue bounds the signals waiting for the broker: past it a signal
// is dropped (counted as skipped), so a broker slower than the clients
// costs memory of no one.
const signalQueue = 4096

// signalBatch is the most signals handed to the broker in one round trip.
const signalBatch = 256

type signalJob struct {
	key   string
	tag   uint64
	frame []byte
}

// signalNodeMask keeps the node's part of a tag (with signalBit).
const signalNodeMask = signalBit | 0x7fffffff<<32

// signalNode is the node's random part of its members' signal tags.
func signalNode() uint64 { return uint64(rand.Uint32()>>1) << 32 }

// IsSignal reports whether seq, as the broker carries it, is a signal's
// sender tag rather than a message's seq.
func IsSignal(seq uint64) bool { return seq&signalBit != 0 }

// Signal sends a signal of m, already checked against the room's publish
// permission and the connection's rate, to the other members of the room
// key on every node. room is key's room part and from the sender's user.
// The frame is built once in the loop's arena. Loop only; never blocks.
func (t *Table) Signal(m *Member, key string, room []byte, from string, body []byte) {
	n := t.node
	if n == nil {
		return
	}
	tag := n.tagOf(m)
	a := t.arena
	frame := a.Keep(proto.AppendSignalFrame(a.Space(proto.SignalFrameLen(room, from, body)), room, from, body))
	select {
	case n.signals <- signalJob{key: key, tag: tag, frame: frame}:
	default:
		n.Stats.SignalsSkipped.Add(1)
	}
}

// tagOf is m's sender tag, made at its first use. Loop only.
func (n *Node) tagOf(m *Member) uint64 {
	if m.chat == nil {
		m.chat = &memberChat{}
	}
	if m.chat.sig == 0 {
		m.chat.sig = signalBit | n.sigNode | uint64(n.sigSerial.Add(1))
	}
	return m.chat.sig
}

// Chat is m's chat state, made on first use. Loop only.
func (m *Member) Chat() *memberChat {
	if m.chat == nil {
		m.chat = &memberChat{}
	}
	return m.chat
}

// signaller hands queued signals to the broker, in batches of what has
// gathered while the previous one was out.
func (n *Node) signaller() {
	defer n.wg.Done()
	pubs := make([]pubsub.Publication, 0, signalBatch)
	errs := make([]error, signalBatch)
	for {
		select {
		case <-n.done:
			return
		case j := <-n.signals:
			pubs = append(pubs[:0], pubsub.Publication{Key: j.key, Seq: j.tag, Frame: j.frame})
		more:
			for len(pubs) < signalBatch {
				select {
				case j := <-n.signals:
					pubs = append(pubs, pubsub.Publication{Key: j.key, Seq: j.tag, Frame: j.frame})
				default:
					break more
				}
			}
			if failed := n.bus.PublishBatch(context.Background(), pubs, errs); failed > 0 {
				n.Stats.SignalsSkipped.Add(uint64(failed))
			}
			clear(pubs)
			clear(errs)
		}
	}
}

// signal queues a signal delivered by the broker for r's live members
// but its sender. A member whose outbound queue is over half its limit
// skips it: a signal is worth less than the messages behind it, and it is
// queued past the limit check (Push), so it never makes a member slow.
// event is the signal's SSE event when the hub built one.
func (t *Table) signal(r *Room, tag uint64, frame, event []byte) {
	var sent, skipped uint64
	half := t.q.Limit() / 2
	for _, m := range r.members {
		if m.chat != nil && m.chat.sig == tag {
			continue
		}
		o := &m.Out
		if o.Slow() || o.Closed() {
			continue
		}
		if o.PendingBytes()+o.Backlog() > half {
			skipped++
			continue
		}
		if m.sse != nil {
			if event == nil {
				event = buildSignalEvent(t.arena, frame)
			}
			m.sse.events++
			t.q.Push(o, event)
		} else {
			t.q.Push(o, frame)
		}
		sent++
	}
	if t.node != nil {
		if sent > 0 {
			t.node.Stats.SignalsSent.Add(sent)
		}
		if skipped > 0 {
			t.node.Stats.SignalsSkipped.Add(skipped)
		}
	}
}

// buildSignalEvent builds the SSE event of a signal frame: "event:
// signal" and no id line, since a signal moves no position.
func buildSignalEvent(a *Arena, frame []byte) []byte { return buildChatEvent(a, "signal", frame) }

// buildChatEvent builds the SSE event of a chat frame that moves no
// position of the stream (signal, read, receipts): "event: NAME", the
// frame's JSON as data, and no id line.
func buildChatEvent(a *Arena, name string, frame []byte) []byte {
	payload, _ := proto.ServerFramePayload(frame)
	b := a.Space(proto.SSEEventLen(name, len(payload), 0) + 1)
	b = proto.AppendSSEEvent(b, name, payload)
	b = append(b, '\n')
	return a.Keep(b)
}

// Signal reports whether ev is a signal for a loop: one the loop may drop
// when its inbox is full (at most once), where a message must be repaired.
func (ev *Event) Signal() bool { return ev.kind == evSignal }
