//go:build linux

package bench

import (
	"testing"
	"time"

	"github.com/roost-chat/roost/proto"
)

// FuzzReceivePath feeds the receive path whatever a node (or anything
// listening where a node should be) might send, split at an arbitrary point:
// it must never panic, and a connection it closes stays closed.
func FuzzReceivePath(f *testing.F) {
	now := time.Now().UnixNano()
	f.Add(serverStream(1, 3, now), 7)
	f.Add(proto.AppendJoinedFrame(nil, []byte("r0"), &proto.Joined{Seq: 5, Epoch: "e0"}), 1)
	f.Add([]byte("\x81\x7e\x00\x05hello"), 3)
	f.Add([]byte("\x88\x02\x03\xe8"), 0)
	f.Add([]byte("\x01\x03abc\x80\x01d"), 4)
	f.Add([]byte("\x81\x20"+`{"op":"msg","room":"r0","seq":1}`), 9)
	f.Fuzz(func(t *testing.T, data []byte, cut int) {
		l, c := testLoop(t)
		if cut < 0 || cut > len(data) {
			cut = len(data) / 2
		}
		rest := l.frames(c, data[:cut], now)
		if c.state == stClosed {
			return
		}
		in := append(append([]byte(nil), rest...), data[cut:]...)
		l.frames(c, in, now)
	})
}

// FuzzMsgFast checks the fast path against the full decoder on every msg
// frame the node's encoder can produce: when the fast path takes a frame,
// it must read the same seq and stamp as DecodeServer and bodyStamp.
func FuzzMsgFast(f *testing.F) {
	f.Add("r0", "r0", uint64(1), "7", "u1", int64(1764484800123), []byte(`{"p":"xx","t":1764484800123456789}`))
	f.Add("room-1:a.b", "r", uint64(987654321), "", "u\"x", int64(-1), []byte(`{"t":5}`))
	f.Add("r\\0", "r\\0", uint64(0), "id", "u", int64(0), []byte(`[1,{"t":2}]`))
	f.Add("ü", "", uint64(1<<63), "\x00", "\u2028", int64(1), []byte(`null`))
	f.Fuzz(func(t *testing.T, room, connRoom string, seq uint64, id, from string, ts int64, body []byte) {
		frame := proto.AppendMsgFrame(nil, room, seq, []byte(id), from, ts, body)
		_, hn, err := proto.ParseFrameHeader(frame)
		if err != nil || hn == 0 {
			t.Fatalf("encoder made a bad header: %v", err)
		}
		payload := frame[hn:]
		var fr proto.ServerFrame
		if proto.DecodeServer(payload, &fr) != nil {
			return // a body that is not JSON: the node refuses it at publish
		}
		s, stamp, ok := msgFast(payload, []byte(connRoom))
		if ok && (s != fr.Seq || stamp != bodyStamp(fr.Body)) {
			t.Fatalf("%s: fast seq %d stamp %d, decoder seq %d stamp %d", payload, s, stamp, fr.Seq, bodyStamp(fr.Body))
		}
	})
}
