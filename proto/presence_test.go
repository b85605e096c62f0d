package proto

import (
	"encoding/json"
	"slices"
	"testing"
)

// Presence frames are JSON whatever the names hold: quotes, backslashes,
// control characters are escaped, invalid UTF-8 becomes U+FFFD.
func TestPresenceFrames(t *testing.T) {
	users := []string{"alice", `quo"te`, `back\slash`, "tab\there", "é ü 日本", "bad\xffutf8"}
	want := []string{"alice", `quo"te`, `back\slash`, "tab\there", "é ü 日本", "bad\ufffdutf8"}
	var f struct {
		Op, Room     string
		Count        int
		Users        []string
		More         bool
		Joined, Left []string
	}
	decode := func(frame []byte) {
		t.Helper()
		h, n, err := ParseFrameHeader(frame)
		if err != nil || int(h.Length) != len(frame)-n {
			t.Fatalf("bad header of %q", frame)
		}
		f = struct {
			Op, Room     string
			Count        int
			Users        []string
			More         bool
			Joined, Left []string
		}{}
		if err := json.Unmarshal(frame[n:], &f); err != nil {
			t.Fatalf("not JSON: %q: %v", frame[n:], err)
		}
	}
	decode(AppendPresenceFrame(nil, []byte("r"), len(users), users))
	if f.Op != "presence" || f.Room != "r" || f.Count != 6 || !slices.Equal(f.Users, want) || f.More {
		t.Fatalf("presence %+v", f)
	}
	decode(AppendPresenceFrame(nil, []byte("r"), 10000, users[:1]))
	if f.Count != 10000 || !f.More || len(f.Users) != 1 {
		t.Fatalf("presence with more %+v", f)
	}
	decode(AppendPresenceFrame(nil, []byte("r"), 0, nil))
	if f.Count != 0 || f.Users == nil || len(f.Users) != 0 {
		t.Fatalf("empty presence %+v", f)
	}
	decode(AppendPresenceDiffFrame(nil, []byte("r"), users[:3], users[3:]))
	if f.Op != "presence_diff" || !slices.Equal(f.Joined, want[:3]) || !slices.Equal(f.Left, want[3:]) {
		t.Fatalf("presence_diff %+v", f)
	}
	decode(AppendPresenceDiffFrame(nil, []byte("r"), nil, users[:1]))
	if f.Joined == nil || len(f.Joined) != 0 || len(f.Left) != 1 {
		t.Fatalf("presence_diff with nobody joined %+v", f)
	}
}

func TestDecodePresence(t *testing.T) {
	var cmd Command
	for in, want := range map[string]bool{
		`{"op":"join","room":"r","presence":true}`:  true,
		`{"op":"join","room":"r","presence":false}`: false,
		`{"op":"join","room":"r"}`:                  false,
	} {
		if err := Decode([]byte(in), &cmd); err != nil || cmd.Presence != want || cmd.Op != OpJoin {
			t.Fatalf("%s: %v presence=%v", in, err, cmd.Presence)
		}
	}
	for _, in := range []string{`{"op":"join","room":"r","presence":1}`, `{"op":"join","room":"r","presence":"true"}`, `{"op":"join","room":"r","presence":null}`} {
		if err := Decode([]byte(in), &cmd); err != ErrBadPresence {
			t.Fatalf("%s: %v, want ErrBadPresence", in, err)
		}
	}
	if err := Decode([]byte(`{"op":"presence","room":"lobby"}`), &cmd); err != nil || cmd.Op != OpPresence || string(cmd.Room) != "lobby" {
		t.Fatalf("presence op: %v %+v", err, cmd)
	}
	if err := Decode([]byte(`{"op":"presence"}`), &cmd); err != ErrMissingRoom {
		t.Fatalf("presence without room: %v", err)
	}
}
