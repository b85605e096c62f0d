package proto

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
)

func TestParseSSEPosition(t *testing.T) {
	type item struct {
		room string
		seq  uint64
	}
	good := map[string][]item{
		"":                       nil,
		"a:41":                   {{"a", 41}},
		"a:41,b:7":               {{"a", 41}, {"b", 7}},
		"x:y:z:0,q.r-s_t:9":      {{"x:y:z", 0}, {"q.r-s_t", 9}},
		"a:18446744073709551615": {{"a", 1<<64 - 1}},
	}
	for in, want := range good {
		var got []item
		if err := ParseSSEPosition([]byte(in), func(room []byte, seq uint64) bool {
			got = append(got, item{string(room), seq})
			return true
		}); err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		if len(got) != len(want) {
			t.Fatalf("%q: %v, want %v", in, got, want)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%q: %v, want %v", in, got, want)
			}
		}
	}
	for _, in := range []string{"a", "a:", ":1", "a:1,", ",a:1", "a:1,,b:2", "a b:1", "a:-1", "a:+1", "a:1x",
		"a:18446744073709551616", "a:000000000000000000001", strings.Repeat("r", 129) + ":1", "a:1;b:2"} {
		if err := ParseSSEPosition([]byte(in), func([]byte, uint64) bool { return true }); err != ErrBadPosition {
			t.Errorf("%q: %v, want ErrBadPosition", in, err)
		}
	}
}

// FuzzSSEPosition: whatever the input, the parser returns an item list
// that prints back to the input (one spelling per position) or refuses
// it; it never panics.
func FuzzSSEPosition(f *testing.F) {
	f.Fuzz(func(t *testing.T, in []byte) {
		var out []byte
		first := true
		err := ParseSSEPosition(in, func(room []byte, seq uint64) bool {
			if !ValidRoom(room) {
				t.Fatalf("bad room %q accepted", room)
			}
			out = AppendSSEPositionItem(out, first, string(room), seq)
			first = false
			return true
		})
		if err != nil {
			return
		}
		// Leading zeros are the one spelling that does not print back.
		if !bytes.Equal(out, in) && !bytes.Contains(in, []byte(":0")) {
			t.Fatalf("%q printed back as %q", in, out)
		}
	})
}

// AppendSSEEvent keeps data byte for byte when it has no line break, and
// splits it into data lines that an EventSource joins back with LF.
func TestAppendSSEEvent(t *testing.T) {
	cases := map[string]string{
		`{"a":1}`:          "event: msg\ndata: {\"a\":1}\n",
		"{\"a\":\n1}":      "event: msg\ndata: {\"a\":\ndata: 1}\n",
		"{\"a\":\r\n1}":    "event: msg\ndata: {\"a\":\ndata: 1}\n",
		"{\"a\":\r1,\n\n}": "event: msg\ndata: {\"a\":\ndata: 1,\ndata: \ndata: }\n",
	}
	for in, want := range cases {
		got := AppendSSEEvent(nil, "msg", []byte(in))
		if string(got) != want {
			t.Fatalf("%q: %q, want %q", in, got, want)
		}
		if len(got) > SSEEventLen("msg", len(in), strings.Count(in, "\n")+strings.Count(in, "\r")) {
			t.Fatalf("%q: longer than SSEEventLen", in)
		}
	}
}

func TestMsgSeqAndFrameOp(t *testing.T) {
	f := AppendMsgFrame(nil, "r:1", 12345, []byte("id"), "u", 1, []byte(`{"seq":9}`))
	p, n := ServerFramePayload(f)
	if n != len(f) || FrameOp(p) != "msg" {
		t.Fatalf("payload %q n %d", p, n)
	}
	if seq, ok := MsgSeq(p); !ok || seq != 12345 {
		t.Fatalf("seq %d %v", seq, ok)
	}
	j := AppendJoinedFrame(nil, []byte("r"), &Joined{Seq: 3, Epoch: "E"})
	if p, _ := ServerFramePayload(j); FrameOp(p) != "joined" {
		t.Fatalf("joined op %q", FrameOp(p))
	}
	if _, ok := MsgSeq([]byte(`{"op":"joined","room":"r","seq":` + strconv.Itoa(3) + `}`)); ok {
		t.Fatal("seq of a joined")
	}
}
