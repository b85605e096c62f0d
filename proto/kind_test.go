package proto

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDecodeKinds(t *testing.T) {
	for _, tc := range []struct {
		in   string
		err  error
		kind Kind
		ref  uint64
	}{
		{`{"op":"pub","room":"r","id":"a","body":1}`, nil, KindMsg, 0},
		{`{"op":"pub","room":"r","id":"a","kind":"msg","body":1}`, nil, KindMsg, 0},
		{`{"op":"pub","room":"r","id":"a","kind":"edit","ref":5,"body":"new"}`, nil, KindEdit, 5},
		{`{"op":"pub","room":"r","id":"a","kind":"delete","ref":5}`, nil, KindDelete, 5},
		{`{"op":"pub","room":"r","id":"a","kind":"react","ref":5,"body":"👍"}`, nil, KindReact, 5},
		{`{"op":"pub","room":"r","id":"a","kind":"unreact","ref":5,"body":"\ud83d\udc4d"}`, nil, KindUnreact, 5},
		{`{"op":"pub","room":"r","id":"a","kind":"react","ref":5,"body":"` + strings.Repeat("x", 32) + `"}`, nil, KindReact, 5},
		// Bad input, each a clear error.
		{`{"op":"pub","room":"r","id":"a","kind":"shout","ref":5,"body":1}`, ErrBadKind, 0, 0},
		{`{"op":"pub","room":"r","id":"a","kind":"Edit","ref":5,"body":1}`, ErrBadKind, 0, 0},
		{`{"op":"pub","room":"r","id":"a","kind":7,"ref":5,"body":1}`, ErrBadKind, 0, 0},
		{`{"op":"pub","room":"r","id":"a","kind":"edit","body":1}`, ErrMissingRef, 0, 0},
		{`{"op":"pub","room":"r","id":"a","kind":"edit","ref":0,"body":1}`, ErrBadRef, 0, 0},
		{`{"op":"pub","room":"r","id":"a","kind":"edit","ref":-1,"body":1}`, ErrBadRef, 0, 0},
		{`{"op":"pub","room":"r","id":"a","kind":"edit","ref":"5","body":1}`, ErrBadRef, 0, 0},
		{`{"op":"pub","room":"r","id":"a","ref":5,"body":1}`, ErrExtraRef, 0, 0},
		{`{"op":"pub","room":"r","id":"a","kind":"msg","ref":5,"body":1}`, ErrExtraRef, 0, 0},
		{`{"op":"pub","room":"r","id":"a","kind":"edit","ref":5}`, ErrEmptyEdit, 0, 0},
		{`{"op":"pub","room":"r","id":"a","kind":"delete","ref":5,"body":1}`, ErrDeleteBody, 0, 0},
		{`{"op":"pub","room":"r","id":"a","kind":"react","ref":5}`, ErrBadReaction, 0, 0},
		{`{"op":"pub","room":"r","id":"a","kind":"react","ref":5,"body":""}`, ErrBadReaction, 0, 0},
		{`{"op":"pub","room":"r","id":"a","kind":"react","ref":5,"body":1}`, ErrBadReaction, 0, 0},
		{`{"op":"pub","room":"r","id":"a","kind":"react","ref":5,"body":["x"]}`, ErrBadReaction, 0, 0},
		{`{"op":"pub","room":"r","id":"a","kind":"react","ref":5,"body":"` + strings.Repeat("x", 33) + `"}`, ErrBadReaction, 0, 0},
		{`{"op":"pub","room":"r","id":"a","kind":"react","ref":5,"body":"` + strings.Repeat("\\u00e9", 17) + `"}`, ErrBadReaction, 0, 0},
		{`{"op":"pub","room":"r","id":"a","kind":"unreact","ref":5,"body":"a\nb"}`, ErrBadReaction, 0, 0},
		{`{"op":"pub","room":"r","id":"a","kind":"unreact","ref":5,"body":"\u0000"}`, ErrBadReaction, 0, 0},
		{`{"op":"pub","room":"r","id":"a"}`, ErrMissingBody, 0, 0},
	} {
		var cmd Command
		err := Decode([]byte(tc.in), &cmd)
		if err != tc.err {
			t.Errorf("Decode(%s) = %v, want %v", tc.in, err, tc.err)
			continue
		}
		if err == nil && (cmd.Kind != tc.kind || cmd.Ref != tc.ref) {
			t.Errorf("Decode(%s): kind %v ref %d, want %v %d", tc.in, cmd.Kind, cmd.Ref, tc.kind, tc.ref)
		}
	}
}

func TestDecodeHistoryFold(t *testing.T) {
	var cmd Command
	if err := Decode([]byte(`{"op":"history","room":"r","after":5,"fold":true,"limit":2}`), &cmd); err != nil {
		t.Fatal(err)
	}
	if !cmd.Fold || !cmd.HasAfter || cmd.After != 5 || cmd.HasBefore || cmd.Limit != 2 {
		t.Fatalf("%+v", cmd)
	}
	if err := Decode([]byte(`{"op":"history","room":"r","fold":1}`), &cmd); err != ErrBadFold {
		t.Fatal(err)
	}
	if err := Decode([]byte(`{"op":"history","room":"r","before":9,"after":1}`), &cmd); err != ErrBeforeAfter {
		t.Fatal(err)
	}
}

func TestDecodeKindAllocs(t *testing.T) {
	in := []byte(`{"op":"pub","room":"r","id":"a","kind":"react","ref":5,"body":"\ud83d\udc4d"}`)
	var cmd Command
	if a := testing.AllocsPerRun(100, func() { _ = Decode(in, &cmd) }); a != 0 {
		t.Fatalf("Decode of a react allocates %v times", a)
	}
}

func TestMsgFrameKind(t *testing.T) {
	f := AppendMsgFrameKind(nil, "r", 9, []byte("e-1"), "alice", 1000, KindEdit, 3, []byte(`"hi"`))
	p := textPayload(t, f)
	var m map[string]any
	if err := json.Unmarshal(p, &m); err != nil {
		t.Fatal(err)
	}
	if m["kind"] != "edit" || m["ref"] != float64(3) || m["body"] != "hi" || m["seq"] != float64(9) {
		t.Fatalf("%s", p)
	}
	var sf ServerFrame
	if err := DecodeServer(p, &sf); err != nil || string(sf.Kind) != "edit" || sf.RefSeq != 3 {
		t.Fatalf("DecodeServer(%s): %v %+v", p, err, sf)
	}
	// A plain message names neither.
	p = textPayload(t, AppendMsgFrame(nil, "r", 9, []byte("e-1"), "alice", 1000, []byte(`1`)))
	if strings.Contains(string(p), "kind") || strings.Contains(string(p), "ref") {
		t.Fatalf("%s", p)
	}
	// A delete's body is null.
	p = textPayload(t, AppendMsgFrameKind(nil, "r", 10, []byte("d"), "alice", 1000, KindDelete, 3, nil))
	if !strings.Contains(string(p), `"kind":"delete","ref":3,"body":null}`) {
		t.Fatalf("%s", p)
	}
}

func TestFoldedJSON(t *testing.T) {
	m := Message{Room: "r", Seq: 4, ID: "a", From: "bob", TS: 4, Body: []byte(`"edited"`), Folded: true, Edited: 9,
		Reactions: []Reaction{{"👍", 2}, {"a\"b", 1}}}
	frame := AppendHistoryFrame(nil, []byte("r"), []Message{m, {Room: "r", Seq: 5, ID: "b", From: "x", TS: 5, Body: []byte(`1`), Folded: true, Deleted: true}}, false)
	p := textPayload(t, frame)
	var h struct {
		Messages []map[string]any `json:"messages"`
	}
	if err := json.Unmarshal(p, &h); err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	a, b := h.Messages[0], h.Messages[1]
	if a["body"] != "edited" || a["edited"] != float64(9) || a["deleted"] != nil ||
		a["reactions"].(map[string]any)["👍"] != float64(2) || a["reactions"].(map[string]any)["a\"b"] != float64(1) {
		t.Fatalf("%s", p)
	}
	if b["body"] != nil || b["deleted"] != true || b["edited"] != nil || b["reactions"] != nil {
		t.Fatalf("%s", p)
	}
	if _, ok := b["body"]; !ok {
		t.Fatalf("a deleted message has body null: %s", p)
	}
	one := textPayload(t, AppendMsgMessageFrame(nil, &m))
	if !strings.HasPrefix(string(one), `{"op":"msg"`) || !json.Valid(one) {
		t.Fatalf("%s", one)
	}
}

func TestReactionText(t *testing.T) {
	for in, want := range map[string]string{`"👍"`: "👍", `"\u00e9"`: "é", ` "x" `: "x", `"\ud83d\udc4d"`: "👍"} {
		got, ok := ReactionText(nil, []byte(in))
		if !ok || string(got) != want {
			t.Errorf("ReactionText(%s) = %q %v, want %q", in, got, ok, want)
		}
	}
	for _, in := range []string{`""`, `1`, `"a"x`, `null`, `"` + strings.Repeat("é", 17) + `"`, `"\t"`} {
		if _, ok := ReactionText(nil, []byte(in)); ok {
			t.Errorf("ReactionText(%s) accepted", in)
		}
	}
}

// TestKindFuzzSeeds keeps the fuzz corpus holding the new pub fields.
func TestKindFuzzSeeds(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzDecode")
	for _, name := range []string{"kind-edit", "kind-react-escaped", "kind-extra-ref", "kind-bad", "history-fold"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Errorf("fuzz seed %s: %v", name, err)
		}
	}
}

func textPayload(t *testing.T, frame []byte) []byte {
	t.Helper()
	_, p, rest := readServerFrame(t, frame)
	if len(rest) != 0 {
		t.Fatalf("%d bytes after the frame", len(rest))
	}
	return p
}
