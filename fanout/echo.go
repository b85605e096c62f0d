package fanout

import (
	"hash/maphash"

	"github.com/roost-chat/roost/proto"
)

// Echo off: a member joined with "echo":false is not sent the msg frames
// of its own publishes in that room; their ack carries the seq. A
// publish's msg may reach the member's loop before its ack (the in-process
// broker delivers before the sources are answered) or after it (Redis), so
// the member remembers its recent publishes in such rooms by id until
// their msg passes: by seq once the ack told it, by id and user before.
// Only members that asked for it hold anything, and a room counts them:
// for a room with none the fan-out costs one test per message.

// maxOwnPubs bounds a member's remembered publishes: a client with more
// publishes in flight than this in echo-off rooms may see some of its own
// (the oldest are forgotten), never miss another's.
const maxOwnPubs = 64

var ownSeed = maphash.MakeSeed()

type ownPub struct {
	key string
	id  uint64 // maphash of the id
	seq uint64 // 0 until the ack
}

// ownPubs is a Member's echo-off state.
type ownPubs struct {
	rooms []string // keys of the rooms joined with echo off
	pubs  []ownPub // oldest first
	buf   [4*64 + 4*proto.MaxUser]byte
}

// SetEcho records whether m gets its own publishes in room key, just
// joined (a join's "echo"). Loop only.
func (t *Table) SetEcho(m *Member, key string, echo bool) {
	r := t.rooms[key]
	if echo {
		if r != nil {
			t.echoOn(m, r)
		}
		return
	}
	c := m.Chat()
	if c.own == nil {
		c.own = &ownPubs{}
	}
	if r != nil {
		r.noEcho++
	}
	if !c.own.off(key) {
		c.own.rooms = append(c.own.rooms, key)
	}
}

// echoOn ends m's echo off in r (a leave, a join with echo).
func (t *Table) echoOn(m *Member, r *Room) {
	if m.chat == nil || m.chat.own == nil || !m.chat.own.off(r.key) {
		return
	}
	if r.noEcho > 0 {
		r.noEcho--
	}
	m.chat.own.forget(r.key)
}

// EchoOff reports whether m has a room joined with echo off. Loop only.
func (m *Member) EchoOff() bool {
	return m.chat != nil && m.chat.own != nil && len(m.chat.own.rooms) > 0
}

// forget drops room key's echo-off state (a join with echo, a leave).
func (o *ownPubs) forget(key string) {
	for i, k := range o.rooms {
		if k == key {
			o.rooms = append(o.rooms[:i], o.rooms[i+1:]...)
			break
		}
	}
	keep := o.pubs[:0]
	for _, p := range o.pubs {
		if p.key != key {
			keep = append(keep, p)
		}
	}
	o.pubs = keep
}

// Published tells m its connection published id in room key, so that the
// msg of it is left out if the room is echo off. Loop only.
func (m *Member) Published(key string, id []byte) {
	if m.chat == nil {
		return
	}
	o := m.chat.own
	if o == nil || !o.off(key) {
		return
	}
	if len(o.pubs) == maxOwnPubs {
		o.pubs = append(o.pubs[:0], o.pubs[1:]...)
	}
	o.pubs = append(o.pubs, ownPub{key: key, id: maphash.Bytes(ownSeed, id)})
}

// Acked tells m the publish id in room key was answered: stored as seq,
// or refused (seq 0). Loop only.
func (m *Member) Acked(key string, id []byte, seq uint64) {
	if m.chat == nil {
		return
	}
	o := m.chat.own
	if o == nil || len(o.pubs) == 0 {
		return
	}
	h := maphash.Bytes(ownSeed, id)
	for i := range o.pubs {
		if p := &o.pubs[i]; p.key == key && p.id == h && p.seq == 0 {
			if seq == 0 {
				o.pubs = append(o.pubs[:i], o.pubs[i+1:]...)
			} else {
				p.seq = seq
			}
			return
		}
	}
}

func (o *ownPubs) off(key string) bool {
	for _, k := range o.rooms {
		if k == key {
			return true
		}
	}
	return false
}

// skip reports whether the msg frame of seq in room r is one of the
// member's own publishes it asked not to get, and forgets it if so. Pubs
// whose seq the room has passed without their msg (a repeated publish,
// answered with the first one's seq and not delivered again) are dropped
// on the way.
func (o *ownPubs) skip(r *Room, seq uint64, frame []byte, user string) bool {
	if len(o.pubs) == 0 {
		return false
	}
	var id uint64
	parsed := false
	for i := 0; i < len(o.pubs); i++ {
		p := &o.pubs[i]
		if p.key != r.key {
			continue
		}
		if p.seq != 0 {
			if p.seq == seq {
				o.pubs = append(o.pubs[:i], o.pubs[i+1:]...)
				return true
			}
			if p.seq < seq {
				o.pubs = append(o.pubs[:i], o.pubs[i+1:]...)
				i--
			}
			continue
		}
		if !parsed {
			parsed = true
			payload, _ := proto.ServerFramePayload(frame)
			mid, from, ok := proto.MsgOrigin(payload, o.buf[:])
			if !ok || string(from) != user {
				return false
			}
			id = maphash.Bytes(ownSeed, mid)
		}
		if p.id == id {
			o.pubs = append(o.pubs[:i], o.pubs[i+1:]...)
			return true
		}
	}
	return false
}
