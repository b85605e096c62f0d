package proto

import (
	"testing"

	"github.com/gobwas/ws"
)

func TestParseFrameHeader(t *testing.T) {
	mask := [4]byte{0xa, 0xb, 0xc, 0xd}
	tests := []struct {
		name string
		in   []byte
		want ws.Header
		n    int
		err  error
	}{
		{"text", []byte{0x81, 0x05}, ws.Header{Fin: true, OpCode: ws.OpText, Length: 5}, 2, nil},
		{"masked", []byte{0x81, 0x85, 0xa, 0xb, 0xc, 0xd}, ws.Header{Fin: true, OpCode: ws.OpText, Masked: true, Mask: mask, Length: 5}, 6, nil},
		{"continuation", []byte{0x00, 0x7d}, ws.Header{OpCode: ws.OpContinuation, Length: 125}, 2, nil},
		{"binary not fin", []byte{0x02, 0x00}, ws.Header{OpCode: ws.OpBinary}, 2, nil},
		{"16-bit", []byte{0x81, 0x7e, 0x01, 0x00}, ws.Header{Fin: true, OpCode: ws.OpText, Length: 256}, 4, nil},
		{"16-bit masked", []byte{0x81, 0xfe, 0xff, 0xff, 0xa, 0xb, 0xc, 0xd}, ws.Header{Fin: true, OpCode: ws.OpText, Masked: true, Mask: mask, Length: 65535}, 8, nil},
		{"64-bit", []byte{0x82, 0x7f, 0, 0, 0, 1, 0, 0, 0, 0}, ws.Header{Fin: true, OpCode: ws.OpBinary, Length: 1 << 32}, 10, nil},
		{"64-bit max", []byte{0x82, 0xff, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4}, ws.Header{Fin: true, OpCode: ws.OpBinary, Masked: true, Mask: [4]byte{1, 2, 3, 4}, Length: 1<<63 - 1}, 14, nil},
		{"close", []byte{0x88, 0x82, 1, 2, 3, 4}, ws.Header{Fin: true, OpCode: ws.OpClose, Masked: true, Mask: [4]byte{1, 2, 3, 4}, Length: 2}, 6, nil},
		{"ping 125", []byte{0x89, 0x7d}, ws.Header{Fin: true, OpCode: ws.OpPing, Length: 125}, 2, nil},
		{"pong", []byte{0x8a, 0x00}, ws.Header{Fin: true, OpCode: ws.OpPong}, 2, nil},

		{"empty", nil, ws.Header{}, 0, nil},
		{"one byte", []byte{0x81}, ws.Header{}, 0, nil},
		{"16-bit short", []byte{0x81, 0x7e, 0x01}, ws.Header{}, 0, nil},
		{"64-bit short", []byte{0x81, 0x7f, 0, 0, 0, 0, 0, 0, 1}, ws.Header{}, 0, nil},
		{"mask short", []byte{0x81, 0x85, 1, 2, 3}, ws.Header{}, 0, nil},

		{"rsv1", []byte{0xc1, 0x00}, ws.Header{}, 0, ErrProtocol},
		{"rsv2", []byte{0xa1, 0x00}, ws.Header{}, 0, ErrProtocol},
		{"rsv3", []byte{0x91, 0x00}, ws.Header{}, 0, ErrProtocol},
		{"opcode 3", []byte{0x83, 0x00}, ws.Header{}, 0, ErrProtocol},
		{"opcode 7", []byte{0x87, 0x00}, ws.Header{}, 0, ErrProtocol},
		{"opcode 0xb", []byte{0x8b, 0x00}, ws.Header{}, 0, ErrProtocol},
		{"opcode 0xf", []byte{0x8f, 0x00}, ws.Header{}, 0, ErrProtocol},
		{"ping not fin", []byte{0x09, 0x00}, ws.Header{}, 0, ErrProtocol},
		{"close not fin", []byte{0x08, 0x80}, ws.Header{}, 0, ErrProtocol},
		{"ping 126", []byte{0x89, 0x7e, 0x00, 0x7e}, ws.Header{}, 0, ErrProtocol},
		{"pong 127", []byte{0x8a, 0xff}, ws.Header{}, 0, ErrProtocol},
		{"64-bit top bit", []byte{0x82, 0x7f, 0x80, 0, 0, 0, 0, 0, 0, 0}, ws.Header{}, 0, ErrProtocol},
	}
	for _, tt := range tests {
		h, n, err := ParseFrameHeader(tt.in)
		if h != tt.want || n != tt.n || err != tt.err {
			t.Errorf("%s: got %+v n=%d err=%v, want %+v n=%d err=%v", tt.name, h, n, err, tt.want, tt.n, tt.err)
		}
		checkHeaderSplits(t, tt.in)
	}
}

// checkHeaderSplits checks that every prefix of in reports "incomplete"
// or the same error as the whole, and that the header's trailing bytes do
// not change the result.
func checkHeaderSplits(t *testing.T, in []byte) {
	t.Helper()
	h, n, err := ParseFrameHeader(in)
	for k := 0; k < len(in); k++ {
		ph, pn, perr := ParseFrameHeader(in[:k])
		switch {
		case perr != nil:
			if perr != err {
				t.Fatalf("prefix %d of %x: err %v, whole %v", k, in, perr, err)
			}
		case pn != 0:
			if pn != n || ph != h {
				t.Fatalf("prefix %d of %x: n=%d %+v, whole n=%d %+v", k, in, pn, ph, n, h)
			}
		}
	}
	if n > 0 {
		more := append(append([]byte(nil), in...), 0xff, 0x00, 0x81)
		if h2, n2, err2 := ParseFrameHeader(more); h2 != h || n2 != n || err2 != nil {
			t.Fatalf("trailing bytes change %x: %+v %d %v", in, h2, n2, err2)
		}
	}
}

// TestFrameStreamSplits feeds a stream of frames cut at every point, as
// the loop sees them, and checks every frame comes out whole.
func TestFrameStreamSplits(t *testing.T) {
	var stream []byte
	payloads := [][]byte{[]byte(`{"op":"ping"}`), make([]byte, 300), []byte{}, make([]byte, 126)}
	for k, p := range payloads {
		stream = AppendClientFrame(stream, ws.OpText, [4]byte{byte(k), 2, 3, 4}, p)
	}
	stream = AppendClientFrame(stream, ws.OpPing, [4]byte{9, 9, 9, 9}, []byte("x"))
	for cut := 0; cut <= len(stream); cut++ {
		var got int
		buf := append([]byte(nil), stream[:cut]...)
		pending := stream[cut:]
		for {
			h, n, err := ParseFrameHeader(buf)
			if err != nil {
				t.Fatalf("cut %d: %v", cut, err)
			}
			if n == 0 || int64(len(buf)-n) < h.Length {
				if len(pending) == 0 {
					break
				}
				buf = append(buf, pending...)
				pending = nil
				continue
			}
			buf = buf[n+int(h.Length):]
			got++
		}
		if got != len(payloads)+1 || len(buf) != 0 {
			t.Fatalf("cut %d: %d frames, %d bytes left", cut, got, len(buf))
		}
	}
}

func FuzzFrameHeader(f *testing.F) {
	f.Fuzz(func(t *testing.T, in []byte) {
		h, n, err := ParseFrameHeader(in)
		if err == nil && n > 0 {
			if n > len(in) || n < 2 || n > 14 || h.Length < 0 || h.Rsv != 0 {
				t.Fatalf("%x: %+v n=%d", in, h, n)
			}
			if h.OpCode.IsControl() && (!h.Fin || h.Length > 125) {
				t.Fatalf("%x: bad control frame accepted", in)
			}
			// A FIN header with a minimal length encoding re-encodes to the
			// same bytes.
			if h.Fin && h.Length <= 1<<31 {
				re := appendHeader(nil, h.OpCode, h.Masked, int(h.Length))
				if h.Masked {
					re = append(re, h.Mask[:]...)
				}
				if len(re) == n && string(re) != string(in[:n]) {
					t.Fatalf("%x: re-encoded %x", in[:n], re)
				}
			}
		}
		checkHeaderSplits(t, in)
	})
}

func TestParseFrameHeaderAllocs(t *testing.T) {
	in := []byte{0x81, 0xfe, 0x01, 0x00, 1, 2, 3, 4}
	payload := make([]byte, 256)
	if a := testing.AllocsPerRun(100, func() {
		h, _, _ := ParseFrameHeader(in)
		Unmask(payload, h.Mask)
	}); a != 0 {
		t.Fatalf("allocates %v", a)
	}
}

var sinkHeader ws.Header

func BenchmarkParseFrameHeader(b *testing.B) {
	in := AppendClientFrame(nil, ws.OpText, [4]byte{1, 2, 3, 4}, make([]byte, 150))
	b.ReportAllocs()
	for b.Loop() {
		h, _, err := ParseFrameHeader(in)
		if err != nil {
			b.Fatal(err)
		}
		sinkHeader = h
	}
}

func BenchmarkUnmask150(b *testing.B) {
	p := make([]byte, 150)
	b.ReportAllocs()
	b.SetBytes(150)
	for b.Loop() {
		Unmask(p, [4]byte{1, 2, 3, 4})
	}
}

// TestClientToCommand is the loop's inbound path: a masked client frame is
// parsed, unmasked in place and decoded.
func TestClientToCommand(t *testing.T) {
	in := []byte(`{"op":"pub","room":"lobby","id":"m-1","body":{"text":"\u00e9", "n":-0.0}}`)
	frame := AppendClientFrame(nil, ws.OpText, [4]byte{0xde, 0xad, 0xbe, 0xef}, in)
	h, n, err := ParseFrameHeader(frame)
	if err != nil || n == 0 || !h.Masked {
		t.Fatal(h, n, err)
	}
	payload := frame[n : n+int(h.Length)]
	Unmask(payload, h.Mask)
	var cmd Command
	if err := Decode(payload, &cmd); err != nil {
		t.Fatal(err)
	}
	if cmd.Op != OpPub || string(cmd.Room) != "lobby" || string(cmd.ID) != "m-1" || string(cmd.Body) != `{"text":"\u00e9", "n":-0.0}` {
		t.Fatalf("%+v", cmd)
	}
}
