package fanout

import (
	"bytes"
	"testing"

	"github.com/roost-chat/roost/proto"
)

// The announced positions' broker payload: what appendReadEntry writes,
// readEntries reads back, entry by entry; a cut or garbled payload yields
// whole entries only and never panics.
func FuzzReadEntries(f *testing.F) {
	one := appendReadEntry(nil, proto.RoomKey("app", "r"), "alice", 7, signalBit|1, false)
	two := appendReadEntry(append([]byte(nil), one...), proto.RoomKey("app", "room-2"), "bob", 1<<40, signalBit|2, true)
	f.Add(one)
	f.Add(two)
	f.Add(two[:len(two)-3])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		var again []byte
		k := 0
		readEntries(b, func(tag uint64, own bool, userKey, frame []byte) {
			if len(userKey) > len(b) || len(frame) > len(b) {
				t.Fatalf("entry larger than its payload")
			}
			payload, _ := proto.ServerFramePayload(frame)
			if room, seq, ok := proto.ReadFrameOf(payload); ok {
				app, user, _ := bytes.Cut(userKey, []byte("/"))
				again = appendReadEntry(again, proto.RoomKey(string(app), room), string(user), seq, tag, own)
				k++
			}
		})
		// Entries that parse as read frames are written again whole.
		n := 0
		readEntries(again, func(uint64, bool, []byte, []byte) { n++ })
		if n != k {
			t.Fatalf("%d entries written again, %d read back", k, n)
		}
	})
}

func TestReadEntriesRoundTrip(t *testing.T) {
	b := appendReadEntry(nil, proto.RoomKey("app", "r"), "alice", 7, signalBit|1, false)
	b = appendReadEntry(b, proto.RoomKey("app", "s"), "bob", 9, signalBit|2, true)
	var got []string
	readEntries(b, func(tag uint64, own bool, userKey, frame []byte) {
		payload, _ := proto.ServerFramePayload(frame)
		room, seq, ok := proto.ReadFrameOf(payload)
		if !ok {
			t.Fatalf("not a read frame: %q", payload)
		}
		got = append(got, string(userKey)+" "+room+" "+string(rune('0'+seq))+map[bool]string{true: " own", false: ""}[own])
		if tag&^signalBit == 0 {
			t.Fatal("tag lost")
		}
	})
	if len(got) != 2 || got[0] != "app/alice r 7" || got[1] != "app/bob s 9 own" {
		t.Fatalf("round trip: %q", got)
	}
}
