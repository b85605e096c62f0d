package proto

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestDecodeSignal(t *testing.T) {
	var cmd Command
	if err := Decode([]byte(`{"op":"signal","room":"r","body":{"typing":true}}`), &cmd); err != nil {
		t.Fatal(err)
	}
	if cmd.Op != OpSignal || string(cmd.Room) != "r" || string(cmd.Body) != `{"typing":true}` {
		t.Fatalf("%+v", cmd)
	}
	for in, want := range map[string]*Error{
		`{"op":"signal","room":"r"}`: ErrMissingBody,
		`{"op":"signal","body":1}`:   ErrMissingRoom,
		`{"op":"signal","room":"r","body":"` + strings.Repeat("x", 1023) + `"}`: ErrSignalSize,
	} {
		if err := Decode([]byte(in), &cmd); err != want {
			t.Errorf("Decode(%.60s) = %v, want %v", in, err, want)
		}
	}
	// 1024 bytes exactly is allowed.
	if err := Decode([]byte(`{"op":"signal","room":"r","body":"`+strings.Repeat("x", 1022)+`"}`), &cmd); err != nil {
		t.Fatal(err)
	}
	// A signal's err names its room, even when it carries an id.
	_ = Decode([]byte(`{"op":"signal","room":"r","id":"k"}`), &cmd)
	if string(Ref(&cmd)) != "r" {
		t.Fatalf("ref %q", Ref(&cmd))
	}
}

func TestDecodeEcho(t *testing.T) {
	var cmd Command
	for in, noEcho := range map[string]bool{
		`{"op":"join","room":"r","echo":false}`: true,
		`{"op":"join","room":"r","echo":true}`:  false,
		`{"op":"join","room":"r"}`:              false,
	} {
		if err := Decode([]byte(in), &cmd); err != nil || cmd.NoEcho != noEcho {
			t.Errorf("Decode(%s): err %v, NoEcho %v", in, err, cmd.NoEcho)
		}
	}
	if err := Decode([]byte(`{"op":"join","room":"r","echo":0}`), &cmd); err != ErrBadEcho {
		t.Fatalf("echo 0: %v", err)
	}
}

func TestSignalFrame(t *testing.T) {
	f := AppendSignalFrame(nil, "r", "al\"ice", []byte(`{"x":[1,2]}`))
	if len(f) != SignalFrameLen("r", "al\"ice", []byte(`{"x":[1,2]}`)) {
		t.Fatal("length differs from SignalFrameLen")
	}
	p, n := ServerFramePayload(f)
	if n != len(f) {
		t.Fatal("not one frame")
	}
	var m map[string]any
	if err := json.Unmarshal(p, &m); err != nil || m["op"] != "signal" || m["from"] != `al"ice` || m["room"] != "r" {
		t.Fatalf("%s: %v", p, err)
	}
	if a := testing.AllocsPerRun(100, func() { _ = AppendSignalFrame(f[:0], "r", "alice", []byte(`1`)) }); a != 0 {
		t.Fatalf("AppendSignalFrame allocates %v times with room", a)
	}
}

func TestMsgOrigin(t *testing.T) {
	var buf [4*MaxID + 4*MaxUser]byte
	f := AppendMsgFrame(nil, "r", 12, []byte("k\"é\n"), `al"ice`, 5, []byte(`1`))
	p, _ := ServerFramePayload(f)
	id, from, ok := MsgOrigin(p, buf[:])
	if !ok || string(id) != "k\"é\n" || string(from) != `al"ice` {
		t.Fatalf("%q %q %v", id, from, ok)
	}
	for _, bad := range []string{`{"op":"signal"}`, `{"op":"msg","room":"r","seq":1}`, `{"op":"msg","room":"r","seq":1,"id":"k"`} {
		if _, _, ok := MsgOrigin([]byte(bad), buf[:]); ok {
			t.Fatalf("%s: ok", bad)
		}
	}
	if a := testing.AllocsPerRun(100, func() { _, _, _ = MsgOrigin(p, buf[:]) }); a != 0 {
		t.Fatalf("MsgOrigin allocates %v", a)
	}
}

func TestDecodeUnread(t *testing.T) {
	var cmd Command
	if err := Decode([]byte(`{"op":"unread","rooms":["a", "b\u0063" ,"@alice"]}`), &cmd); err != nil {
		t.Fatal(err)
	}
	var got []string
	RoomList(cmd.Rooms, func(r []byte) { got = append(got, string(r)) })
	if strings.Join(got, ",") != "a,bc,@alice" {
		t.Fatal(got)
	}
	many := `["r"` + strings.Repeat(`,"r"`, 100) + `]`
	for _, in := range []string{`{"op":"unread"}`, `{"op":"unread","rooms":[]}`, `{"op":"unread","rooms":"a"}`,
		`{"op":"unread","rooms":["a",1]}`, `{"op":"unread","rooms":["a b"]}`, `{"op":"unread","rooms":` + many + `}`} {
		if err := Decode([]byte(in), &cmd); err != ErrBadRooms {
			t.Errorf("Decode(%.50s) = %v", in, err)
		}
	}
	in := []byte(`{"op":"unread","rooms":["a","b"]}`)
	if a := testing.AllocsPerRun(100, func() { _ = Decode(in, &cmd) }); a != 0 {
		t.Fatalf("allocates %v", a)
	}
}
