package proto

import (
	"bytes"
	"encoding/json"
	"testing"
	"unicode/utf8"
)

func TestDecodeServer(t *testing.T) {
	tests := []struct {
		in   string
		err  error
		want ServerFrame
	}{
		{`{"op":"joined","room":"lobby","seq":57}`, nil, ServerFrame{Op: b("joined"), Room: b("lobby"), Seq: 57}},
		{`{"op":"joined","room":"lobby","seq":57,"epoch":"e1","recovered":false,"from":3}`, nil,
			ServerFrame{Op: b("joined"), Room: b("lobby"), Seq: 57, Epoch: b("e1"), FromSeq: 3}},
		{`{"op":"joined","room":"lobby","seq":57,"epoch":"e1","recovered":true}`, nil, ServerFrame{Op: b("joined"), Room: b("lobby"), Seq: 57, Epoch: b("e1")}},
		{`{"from":-3}`, ErrServerFrame, ServerFrame{}},
		{`{"from":null}`, ErrServerFrame, ServerFrame{}},
		{`{"op":"ack","id":"m-1","room":"lobby","seq":58}`, nil, ServerFrame{Op: b("ack"), ID: b("m-1"), Room: b("lobby"), Seq: 58}},
		{`{"op":"err","ref":"m-1","code":"rate_limited","message":"a\"b"}`, nil, ServerFrame{Op: b("err"), Ref: b("m-1"), Code: b("rate_limited"), Message: b(`a\"b`)}},
		{`{"op":"msg","room":"lobby","seq":58,"id":"m-1","from":"alice","ts":1764484800123,"body":{"x":[1e0]}}`, nil,
			ServerFrame{Op: b("msg"), Room: b("lobby"), Seq: 58, ID: b("m-1"), From: b("alice"), TS: 1764484800123, Body: b(`{"x":[1e0]}`)}},
		{`{"op":"history","room":"r","messages":[ ]}`, nil, ServerFrame{Op: b("history"), Room: b("r"), Messages: b(`[ ]`)}},
		{`{"op":"pong","extra":{"a":[]}}`, nil, ServerFrame{Op: b("pong")}},
		{`{"ts":-5}`, nil, ServerFrame{TS: -5}},
		{`{"seq":-1}`, ErrServerFrame, ServerFrame{}},
		{`{"seq":1.5}`, ErrServerFrame, ServerFrame{}},
		{`{"ts":9223372036854775808}`, ErrServerFrame, ServerFrame{}},
		{`{"op":1}`, ErrServerFrame, ServerFrame{}},
		{`{"op":"x"`, ErrMalformed, ServerFrame{}},
		{`[]`, ErrMalformed, ServerFrame{}},
		{`{"op":"x"} {}`, ErrMalformed, ServerFrame{}},
	}
	var f ServerFrame
	for _, tt := range tests {
		err := DecodeServer([]byte(tt.in), &f)
		if err != tt.err {
			t.Errorf("DecodeServer(%q) = %v, want %v", tt.in, err, tt.err)
			continue
		}
		if err == nil && !sameFrame(f, tt.want) {
			t.Errorf("DecodeServer(%q) = %+v", tt.in, f)
		}
	}
}

func b(s string) []byte { return []byte(s) }

func sameFrame(x, y ServerFrame) bool {
	eq := bytes.Equal
	return eq(x.Op, y.Op) && eq(x.Room, y.Room) && eq(x.ID, y.ID) && eq(x.From, y.From) && eq(x.Code, y.Code) &&
		eq(x.Ref, y.Ref) && eq(x.Message, y.Message) && eq(x.Body, y.Body) && eq(x.Messages, y.Messages) &&
		eq(x.Epoch, y.Epoch) && x.Seq == y.Seq && x.FromSeq == y.FromSeq && x.TS == y.TS
}

func TestAppendUnescaped(t *testing.T) {
	for raw, want := range map[string]string{
		`plain`: "plain", `a\"b\\c\/d\b\f\n\r\t`: "a\"b\\c/d\b\f\n\r\t", `\u00e9\ud83d\ude00`: "é😀",
		`\ud800x`: "\uFFFDx", `\udc00\ud800`: "\uFFFD\uFFFD", `\ud800\u0041`: "\uFFFDA",
	} {
		got, ok := AppendUnescaped(nil, []byte(raw))
		if !ok || string(got) != want {
			t.Errorf("%q: %q %v", raw, got, ok)
		}
	}
	for _, raw := range []string{`a"b`, `\x`, `\u12`, "\x01", `\`} {
		if got, ok := AppendUnescaped([]byte("k"), []byte(raw)); ok || string(got) != "k" {
			t.Errorf("%q accepted: %q", raw, got)
		}
	}
}

func FuzzDecodeServer(f *testing.F) {
	f.Fuzz(func(t *testing.T, in []byte) {
		var fr ServerFrame
		err := DecodeServer(in, &fr)
		if !utf8.Valid(in) || jsonDepth(in) > MaxDepth-1 {
			return
		}
		trimmed := bytes.TrimLeft(in, " \t\r\n")
		isObj := json.Valid(in) && len(trimmed) > 0 && trimmed[0] == '{'
		if isObj != (err != ErrMalformed) {
			t.Fatalf("DecodeServer(%q) = %v, encoding/json object=%v", in, err, isObj)
		}
		if err != nil {
			return
		}
		var m map[string]json.RawMessage
		if e := json.Unmarshal(in, &m); e != nil {
			t.Fatal(e)
		}
		if raw, ok := m["body"]; ok && !bytes.Equal(raw, fr.Body) {
			t.Fatalf("body %q, encoding/json %q", fr.Body, raw)
		}
		for key, got := range map[string][]byte{"op": fr.Op, "room": fr.Room, "id": fr.ID, "from": fr.From, "message": fr.Message} {
			raw, ok := m[key]
			if !ok {
				continue
			}
			var s string
			if e := json.Unmarshal(raw, &s); e != nil {
				t.Fatalf("%s: %v", key, e)
			}
			if u, ok := AppendUnescaped(nil, got); !ok || string(u) != s {
				t.Fatalf("%s: %q unescapes to %q, encoding/json %q", key, got, u, s)
			}
		}
		if raw, ok := m["seq"]; ok {
			var s uint64
			if e := json.Unmarshal(raw, &s); e != nil || s != fr.Seq {
				t.Fatalf("seq %d, encoding/json %d %v", fr.Seq, s, e)
			}
		}
	})
}

func TestDecodeServerAllocs(t *testing.T) {
	in := AppendMsgFrame(nil, "lobby", 58, []byte("m-1"), "alice", 1764484800123, []byte(`{"t":[1,2,3]}`))[2:]
	var f ServerFrame
	if a := testing.AllocsPerRun(100, func() { _ = DecodeServer(in, &f) }); a != 0 {
		t.Fatalf("allocates %v", a)
	}
}

func BenchmarkDecodeServerMsg(b *testing.B) {
	in := AppendMsgFrame(nil, "lobby", 58, []byte("m-1"), "alice", 1764484800123, []byte(`{"text":"hello there"}`))[2:]
	var f ServerFrame
	b.ReportAllocs()
	for b.Loop() {
		sinkErr = DecodeServer(in, &f)
	}
}
