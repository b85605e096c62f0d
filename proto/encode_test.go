package proto

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/gobwas/ws"
)

// readServerFrame parses one unmasked text frame from b and returns its
// payload and the rest.
func readServerFrame(t *testing.T, b []byte) (ws.Header, []byte, []byte) {
	t.Helper()
	h, n, err := ParseFrameHeader(b)
	if err != nil || n == 0 {
		t.Fatalf("ParseFrameHeader: n=%d err=%v", n, err)
	}
	if !h.Fin || h.Masked {
		t.Fatalf("header %+v", h)
	}
	end := n + int(h.Length)
	if end > len(b) {
		t.Fatalf("frame length %d beyond %d bytes", h.Length, len(b)-n)
	}
	return h, b[n:end], b[end:]
}

func unescaped(t *testing.T, raw []byte) string {
	t.Helper()
	s, ok := AppendUnescaped(nil, raw)
	if !ok {
		t.Fatalf("AppendUnescaped(%q) failed", raw)
	}
	return string(s)
}

func TestMsgFrameRoundTrip(t *testing.T) {
	bodies := []string{
		`{"text":"hi"}`, `1e0`, `-0.0`, `"\u00e9"`, `"é"`, `[1,  2 ,{"a":"\ud83d\ude00"}]`,
		`null`, `true`, `"\"\\\/\b\f\n\r\t"`, `12345678901234567890123456789`,
		`{"x":"` + strings.Repeat("y", 200) + `"}`, `{"x":"` + strings.Repeat("z", 70000) + `"}`,
	}
	ids := []string{"m-1", `a"b\c`, "tab\there", "\x00\x1f", "é😀", "\xff\xfe bad utf8"}
	froms := []string{"alice", "", "ünïcode", "ctl\n"}
	for _, body := range bodies {
		for _, id := range ids {
			for _, from := range froms {
				frame := AppendMsgFrame([]byte("prefix"), "lobby", 58, []byte(id), from, -1764484800123, []byte(body))
				if !bytes.HasPrefix(frame, []byte("prefix")) {
					t.Fatal("dst prefix lost")
				}
				h, payload, rest := readServerFrame(t, frame[len("prefix"):])
				if len(rest) != 0 || h.OpCode != ws.OpText {
					t.Fatalf("rest %d op %v", len(rest), h.OpCode)
				}
				if !utf8.Valid(payload) || !json.Valid(payload) {
					t.Fatalf("payload not valid UTF-8 JSON: %q", payload)
				}
				var f ServerFrame
				if err := DecodeServer(payload, &f); err != nil {
					t.Fatalf("DecodeServer(%q): %v", payload, err)
				}
				if string(f.Op) != "msg" || string(f.Room) != "lobby" || f.Seq != 58 || f.TS != -1764484800123 || string(f.Body) != body {
					t.Fatalf("round trip: %+v", f)
				}
				wantID, wantFrom := strings.ToValidUTF8(id, "\uFFFD"), strings.ToValidUTF8(from, "\uFFFD")
				if id == "\xff\xfe bad utf8" {
					wantID = "\uFFFD\uFFFD bad utf8" // one U+FFFD per bad byte
				}
				if got := unescaped(t, f.ID); got != wantID {
					t.Fatalf("id %q, want %q", got, wantID)
				}
				if got := unescaped(t, f.From); got != wantFrom {
					t.Fatalf("from %q, want %q", got, wantFrom)
				}
				// encoding/json agrees on the strings and the field order.
				var m struct{ ID, From string }
				if err := json.Unmarshal(payload, &m); err != nil || m.ID != wantID || m.From != wantFrom {
					t.Fatalf("encoding/json: %+v %v", m, err)
				}
				if !bytes.HasPrefix(payload, []byte(`{"op":"msg","room":"lobby","seq":58,"id":`)) {
					t.Fatalf("field order: %q", payload)
				}
			}
		}
	}
}

func TestMsgFrameExact(t *testing.T) {
	got := AppendMsgFrame(nil, "lobby", 58, []byte("m-1"), "alice", 1764484800123, []byte(`{"t":1}`))
	want := `{"op":"msg","room":"lobby","seq":58,"id":"m-1","from":"alice","ts":1764484800123,"body":{"t":1}}`
	if string(got[2:]) != want || got[0] != 0x81 || int(got[1]) != len(want) {
		t.Fatalf("got %q", got)
	}
	m := Message{Room: "lobby", Seq: 58, ID: "m-1", From: "alice", TS: 1764484800123, Body: []byte(`{"t":1}`)}
	if j := AppendMsgJSON(nil, &m); string(j) != want {
		t.Fatalf("AppendMsgJSON %q", j)
	}
	if j := AppendMsgJSON(nil, &Message{Room: "r"}); string(j) != `{"op":"msg","room":"r","seq":0,"id":"","from":"","ts":0,"body":null}` {
		t.Fatalf("empty body: %q", j)
	}
}

func TestFrameLengthBoundaries(t *testing.T) {
	fixed := len(AppendMsgFrame(nil, "r", 1, []byte("i"), "f", 1, []byte(`""`))) - 2
	for _, n := range []int{125, 126, 127, 65535, 65536, 65537, 200000} {
		body := `"` + strings.Repeat("a", n-fixed) + `"`
		frame := AppendMsgFrame(nil, "r", 1, []byte("i"), "f", 1, []byte(body))
		h, payload, rest := readServerFrame(t, frame)
		if int(h.Length) != n || len(payload) != n || len(rest) != 0 {
			t.Fatalf("n=%d: header length %d, frame %d", n, h.Length, len(frame))
		}
		wantHdr := map[bool]int{true: 2}[n <= 125]
		if n > 125 {
			wantHdr = 4
		}
		if n > 65535 {
			wantHdr = 10
		}
		if len(frame)-n != wantHdr {
			t.Fatalf("n=%d: header %d bytes, want %d", n, len(frame)-n, wantHdr)
		}
	}
}

func TestSmallFrames(t *testing.T) {
	tests := []struct {
		frame []byte
		want  string
	}{
		{AppendJoinedFrame(nil, []byte("lobby"), &Joined{Seq: 57, Epoch: "E1"}), `{"op":"joined","room":"lobby","seq":57,"epoch":"E1"}`},
		{AppendJoinedFrame(nil, []byte("lobby"), &Joined{Seq: 57, Epoch: "E1", Resumed: true, Recovered: true}), `{"op":"joined","room":"lobby","seq":57,"epoch":"E1","recovered":true}`},
		{AppendJoinedFrame(nil, []byte("lobby"), &Joined{Seq: 57, Epoch: `a"b`, Resumed: true, From: 12}), `{"op":"joined","room":"lobby","seq":57,"epoch":"a\"b","recovered":false,"from":12}`},
		{AppendLeftFrame(nil, []byte("lobby")), `{"op":"left","room":"lobby"}`},
		{AppendAckFrame(nil, []byte("m-1"), []byte("lobby"), 58), `{"op":"ack","id":"m-1","room":"lobby","seq":58}`},
		{AppendErrFrame(nil, []byte("m-1"), CodeRateLimited, "slow down"), `{"op":"err","ref":"m-1","code":"rate_limited","message":"slow down"}`},
		{AppendRateLimitedFrame(nil, []byte("m-1"), "slow down", 120), `{"op":"err","ref":"m-1","code":"rate_limited","message":"slow down","retry_after":120}`},
		{AppendAuthedFrame(nil, 1764488400), `{"op":"authed","exp":1764488400}`},
		{AppendAuthedFrame(nil, 1764488400.25), `{"op":"authed","exp":1764488400.25}`},
		{AppendErrFrame(nil, nil, CodeBadRequest, ErrBadRoom.Message), `{"op":"err","ref":"","code":"bad_request","message":"room must match [A-Za-z0-9_.:-]{1,128}"}`},
		{AppendErrFrame(nil, []byte(`"q"`), CodeInternal, "a\\b"), `{"op":"err","ref":"\"q\"","code":"internal","message":"a\\b"}`},
		{AppendPongFrame(nil), `{"op":"pong"}`},
		{AppendHistoryFrame(nil, []byte("lobby"), nil, false), `{"op":"history","room":"lobby","messages":[]}`},
		{AppendHistoryFrame(nil, []byte("lobby"), nil, true), `{"op":"history","room":"lobby","messages":[],"more":true}`},
		{AppendHistoryFrame(nil, []byte("lobby"), []Message{
			{Room: "lobby", Seq: 1, ID: "a", From: "x", TS: 5, Body: []byte(`1e0`)},
			{Room: "lobby", Seq: 2, ID: "b\n", From: "y", TS: 6, Body: []byte(`{"k":[]}`)},
		}, false), `{"op":"history","room":"lobby","messages":[{"op":"msg","room":"lobby","seq":1,"id":"a","from":"x","ts":5,"body":1e0},{"op":"msg","room":"lobby","seq":2,"id":"b\u000a","from":"y","ts":6,"body":{"k":[]}}]}`},
	}
	for _, tt := range tests {
		h, payload, rest := readServerFrame(t, tt.frame)
		if h.OpCode != ws.OpText || len(rest) != 0 || string(payload) != tt.want {
			t.Errorf("got %q (op %v, rest %d), want %q", payload, h.OpCode, len(rest), tt.want)
		}
		if !json.Valid(payload) {
			t.Errorf("invalid JSON %q", payload)
		}
	}
}

func TestCodeString(t *testing.T) {
	want := []string{"", "bad_request", "forbidden", "not_found", "too_large", "rate_limited", "overloaded", "internal"}
	for c := CodeBadRequest; c <= CodeInternal; c++ {
		if c.String() != want[c] {
			t.Errorf("%d: %q", c, c.String())
		}
	}
	if Code(0).String() != "internal" || Code(200).String() != "internal" {
		t.Error("out-of-range codes must read internal")
	}
}

func TestHistoryRoundTrip(t *testing.T) {
	msgs := make([]Message, 300)
	for k := range msgs {
		msgs[k] = Message{Room: "r", Seq: uint64(k + 1), ID: "id", From: "u", TS: int64(k), Body: []byte(`{"n":` + strings.Repeat("1", k%7+1) + `}`)}
	}
	frame := AppendHistoryFrame(nil, []byte("r"), msgs, false)
	_, payload, _ := readServerFrame(t, frame)
	var f ServerFrame
	if err := DecodeServer(payload, &f); err != nil || string(f.Op) != "history" {
		t.Fatal(err, string(f.Op))
	}
	var got []json.RawMessage
	if err := json.Unmarshal(f.Messages, &got); err != nil || len(got) != len(msgs) {
		t.Fatal(err, len(got))
	}
	for k, raw := range got {
		var m ServerFrame
		if err := DecodeServer(raw, &m); err != nil || m.Seq != msgs[k].Seq || string(m.Body) != string(msgs[k].Body) {
			t.Fatalf("message %d: %+v %v", k, m, err)
		}
	}
}

func TestCloseFrame(t *testing.T) {
	f := AppendCloseFrame(nil, CloseTryAgain, string(AppendRetryReason(nil, 1234)))
	h, n, err := ParseFrameHeader(f)
	if err != nil || h.OpCode != ws.OpClose || !h.Fin || h.Masked || int(h.Length) != len(f)-n {
		t.Fatalf("%+v %v", h, err)
	}
	if p := f[n:]; p[0] != 0x03 || p[1] != 0xf5 || string(p[2:]) != "retry=1234" {
		t.Fatalf("payload %q", p)
	}
	// Truncation to 125 bytes, at a rune boundary.
	long := strings.Repeat("é", 100) // 200 bytes
	f = AppendCloseFrame(nil, 1000, long)
	h, n, err = ParseFrameHeader(f)
	if err != nil || h.Length > 125 || !utf8.Valid(f[n+2:]) || len(f[n+2:]) != 122 {
		t.Fatalf("truncated close: len %d, %v", h.Length, err)
	}
	f = AppendCloseFrame(nil, 1000, strings.Repeat("a", 200))
	if h, _, _ = ParseFrameHeader(f); h.Length != 125 {
		t.Fatalf("close len %d", h.Length)
	}
	if f = AppendCloseFrame(nil, 0, "ignored"); len(f) != 2 || f[0] != 0x88 || f[1] != 0 {
		t.Fatalf("empty close %x", f)
	}
}

func TestControlFrame(t *testing.T) {
	f := AppendControlFrame(nil, ws.OpPong, []byte("ping-data"))
	if string(f) != "\x8a\x09ping-data" {
		t.Fatalf("%q", f)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("no panic on a 126-byte control payload")
		}
	}()
	AppendControlFrame(nil, ws.OpPing, make([]byte, 126))
}

func TestClientFrame(t *testing.T) {
	mask := [4]byte{1, 2, 3, 4}
	for _, n := range []int{0, 5, 125, 126, 70000} {
		payload := bytes.Repeat([]byte("abcdefg"), n/7+1)[:n]
		f := AppendClientFrame(nil, ws.OpText, mask, payload)
		h, hn, err := ParseFrameHeader(f)
		if err != nil || !h.Masked || h.Mask != mask || int(h.Length) != n || h.OpCode != ws.OpText || !h.Fin {
			t.Fatalf("n=%d: %+v %v", n, h, err)
		}
		p := append([]byte(nil), f[hn:]...)
		Unmask(p, h.Mask)
		if !bytes.Equal(p, payload) {
			t.Fatalf("n=%d: unmasked payload differs", n)
		}
	}
}

func TestEncodeAllocs(t *testing.T) {
	dst := make([]byte, 0, 1<<16)
	id, room, body := []byte("m-1"), []byte("lobby"), []byte(`{"text":"hello"}`)
	msgs := []Message{{Room: "lobby", Seq: 1, ID: "a", From: "x", TS: 5, Body: body}, {Room: "lobby", Seq: 2, ID: "b\n", From: "y", TS: 6, Body: body}}
	m := &msgs[0]
	key := []byte("dGhlIHNhbXBsZSBub25jZQ==")
	fns := map[string]func(){
		"msg":     func() { dst = AppendMsgFrame(dst[:0], "lobby", 1, id, "alice\x01", 2, body) },
		"msgjson": func() { dst = AppendMsgJSON(dst[:0], m) },
		"history": func() { dst = AppendHistoryFrame(dst[:0], room, msgs, true) },
		"joined":  func() { dst = AppendJoinedFrame(dst[:0], room, &Joined{Seq: 1, Epoch: "e", Resumed: true, From: 3}) },
		"left":    func() { dst = AppendLeftFrame(dst[:0], room) },
		"ack":     func() { dst = AppendAckFrame(dst[:0], id, room, 1) },
		"err":     func() { dst = AppendErrFrame(dst[:0], id, CodeOverloaded, "busy") },
		"pong":    func() { dst = AppendPongFrame(dst[:0]) },
		"close":   func() { dst = AppendCloseFrame(dst[:0], 1013, "retry=5") },
		"control": func() { dst = AppendControlFrame(dst[:0], ws.OpPong, id) },
		"retry":   func() { dst = AppendRetryReason(dst[:0], 1234) },
		"client":  func() { dst = AppendClientFrame(dst[:0], ws.OpText, [4]byte{1, 2, 3, 4}, body) },
		"upgrade": func() { dst = AppendUpgradeResponse(dst[:0], key) },
		"http":    func() { dst = AppendHTTPResponseHeaders(dst[:0], 200, "application/json", "", body) },
		"httperr": func() { dst = AppendHTTPError(dst[:0], ErrWebSocketVersion) },
	}
	for name, fn := range fns {
		if a := testing.AllocsPerRun(100, fn); a != 0 {
			t.Errorf("%s allocates %v times", name, a)
		}
	}
}

var sinkBytes []byte

func BenchmarkAppendMsgFrame(b *testing.B) {
	body := []byte(`{"text":"` + strings.Repeat("x", 89) + `"}`)
	id := []byte("m-12345")
	dst := make([]byte, 0, 512)
	b.ReportAllocs()
	for b.Loop() {
		dst = AppendMsgFrame(dst[:0], "lobby", 123456, id, "alice", 1764484800123, body)
	}
	b.SetBytes(int64(len(dst)))
	sinkBytes = dst
}

func BenchmarkAppendHistoryFrame50(b *testing.B) {
	msgs := make([]Message, 50)
	for k := range msgs {
		msgs[k] = Message{Room: "lobby", Seq: uint64(k + 1), ID: "m-12345", From: "alice", TS: 1764484800123, Body: []byte(`{"text":"` + strings.Repeat("x", 89) + `"}`)}
	}
	dst := make([]byte, 0, 16384)
	b.ReportAllocs()
	for b.Loop() {
		dst = AppendHistoryFrame(dst[:0], []byte("lobby"), msgs, false)
	}
	b.SetBytes(int64(len(dst)))
	sinkBytes = dst
}

// TestQuoteMatchesEncodingJSON checks the string encoder against
// encoding/json on edge cases and random bytes: same decoded value (invalid
// UTF-8 becomes one U+FFFD per byte in both), valid UTF-8 output, and
// quotedLen equal to the appended length.
func TestQuoteMatchesEncodingJSON(t *testing.T) {
	inputs := []string{
		"", "plain", "\"\\", "\x00\x01\x1f\x7f", "é😀", "\u2028\u2029",
		"\xc0\x80", "\xc1\xbf", "\xc2", "\xe0\x80\x80", "\xe0\xa0", "\xed\xa0\x80", "\xed\x9f\xbf",
		"\xef\xbf\xbf", "\xf0\x8f\xbf\xbf", "\xf0\x90\x80\x80", "\xf4\x8f\xbf\xbf", "\xf4\x90\x80\x80",
		"\xf5\x80\x80\x80", "\xff", "a\x80b", "\xf0\x90\x80",
	}
	rng := uint64(1)
	for k := 0; k < 3000; k++ {
		b := make([]byte, k%13)
		for j := range b {
			rng = rng*6364136223846793005 + 1442695040888963407
			b[j] = byte(rng >> 56)
			if j%3 == 0 {
				b[j] |= 0x80
			}
		}
		inputs = append(inputs, string(b))
	}
	for _, s := range inputs {
		q := appendQuoted([]byte("x"), s)[1:]
		if len(q) != quotedLen(s) || len(q) != quotedLen([]byte(s)) {
			t.Fatalf("%q: quotedLen %d, appended %d", s, quotedLen(s), len(q))
		}
		if qb := appendQuoted(nil, []byte(s)); string(qb) != string(q) {
			t.Fatalf("%q: []byte and string encodings differ", s)
		}
		if !utf8.Valid(q) {
			t.Fatalf("%q: output %q not UTF-8", s, q)
		}
		var got, want string
		ref, _ := json.Marshal(s)
		if err := json.Unmarshal(q, &got); err != nil {
			t.Fatalf("%q: %q: %v", s, q, err)
		}
		if err := json.Unmarshal(ref, &want); err != nil || got != want {
			t.Fatalf("%q: decodes to %q, encoding/json %q", s, got, want)
		}
	}
}

func TestEndTextPanicsOnLengthBug(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	endText(make([]byte, 5), 0, 4)
}
