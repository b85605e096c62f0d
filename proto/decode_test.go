package proto

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/bytedance/sonic"
)

func TestDecode(t *testing.T) {
	long := func(c string, n int) string { return strings.Repeat(c, n) }
	type want struct {
		err    error
		op     Op
		room   string
		id     string
		body   string
		since  uint64
		before uint64
		limit  int
		has    string // which of s(ince), b(efore), l(imit) are set
	}
	tests := []struct {
		in string
		want
	}{
		// The protocol's examples.
		{`{"op":"join","room":"lobby"}`, want{op: OpJoin, room: "lobby"}},
		{`{"op":"join","room":"lobby","since":41}`, want{op: OpJoin, room: "lobby", since: 41, has: "s"}},
		{`{"op":"leave","room":"lobby"}`, want{op: OpLeave, room: "lobby"}},
		{`{"op":"pub","room":"lobby","id":"m-1","body":{"text":"hi"}}`, want{op: OpPub, room: "lobby", id: "m-1", body: `{"text":"hi"}`}},
		{`{"op":"history","room":"lobby","before":58,"limit":50}`, want{op: OpHistory, room: "lobby", before: 58, limit: 50, has: "bl"}},
		{`{"op":"ping"}`, want{op: OpPing}},
		{`{"op":"auth","token":"eyJ.eyJ.sig"}`, want{op: OpAuth}},
		{`{"op":"auth"}`, want{err: ErrMissingTok, op: OpAuth}},
		{`{"op":"auth","token":"a\u002eb"}`, want{err: ErrBadToken, op: OpAuth}},
		{`{"op":"auth","token":7}`, want{err: ErrBadToken, op: OpAuth}},

		// Whitespace, key order, duplicates (last wins), unknown fields.
		{" \t\r\n{ \"room\" : \"a\" , \"op\" : \"leave\" } \n", want{op: OpLeave, room: "a"}},
		{`{"op":"ping","op":"join","room":"x"}`, want{op: OpJoin, room: "x"}},
		{`{"op":"join","room":"bad room","room":"ok"}`, want{op: OpJoin, room: "ok"}},
		{`{"op":"join","room":"ok","room":"bad room"}`, want{err: ErrBadRoom, op: OpJoin}},
		{`{"op":"ping","x":[1,{"y":[true,false,null]}],"z":"\u0000"}`, want{op: OpPing}},
		{`{"op":"join","room":"r","since":1,"since":2}`, want{op: OpJoin, room: "r", since: 2, has: "s"}},

		// Escapes are decoded in keys, op, room and id.
		{`{"\u006fp":"p\u0069ng"}`, want{op: OpPing}},
		{`{"op":"join","room":"lob\u0062y"}`, want{op: OpJoin, room: "lobby"}},
		{`{"op":"pub","room":"r","id":"a\"b\\c\/\n\u00e9\ud83d\ude00","body":1}`, want{op: OpPub, room: "r", id: "a\"b\\c/\n\u00e9\U0001F600", body: "1"}},
		{`{"op":"pub","room":"r","id":"\ud800","body":1}`, want{op: OpPub, room: "r", id: "\uFFFD", body: "1"}},
		{`{"op":"join","room":"a\nb"}`, want{err: ErrBadRoom, op: OpJoin}},

		// Body: any value, raw bytes as sent.
		{`{"op":"pub","room":"r","id":"i","body":  1e0 }`, want{op: OpPub, room: "r", id: "i", body: "1e0"}},
		{`{"op":"pub","room":"r","id":"i","body":-0.0}`, want{op: OpPub, room: "r", id: "i", body: "-0.0"}},
		{`{"op":"pub","room":"r","id":"i","body":"\u00e9"}`, want{op: OpPub, room: "r", id: "i", body: `"\u00e9"`}},
		{`{"op":"pub","room":"r","id":"i","body":null}`, want{op: OpPub, room: "r", id: "i", body: "null"}},
		{`{"op":"pub","room":"r","id":"i","body":[ 1 , {"a" : [ ] } ]}`, want{op: OpPub, room: "r", id: "i", body: `[ 1 , {"a" : [ ] } ]`}},
		{`{"op":"pub","body":{},"id":"i","room":"r"}`, want{op: OpPub, room: "r", id: "i", body: `{}`}},

		// Room and id bounds.
		{`{"op":"join","room":"` + long("a", 128) + `"}`, want{op: OpJoin, room: long("a", 128)}},
		{`{"op":"join","room":"` + long("a", 129) + `"}`, want{err: ErrBadRoom, op: OpJoin}},
		{`{"op":"join","room":"` + long(`\u0061`, 129) + `"}`, want{err: ErrBadRoom, op: OpJoin}},
		{`{"op":"join","room":"A-z_0.9:x"}`, want{op: OpJoin, room: "A-z_0.9:x"}},
		{`{"op":"join","room":""}`, want{err: ErrBadRoom, op: OpJoin}},
		{`{"op":"join","room":"é"}`, want{err: ErrBadRoom, op: OpJoin}},
		{`{"op":"join","room":5}`, want{err: ErrBadRoom, op: OpJoin}},
		{`{"op":"join","room":null}`, want{err: ErrBadRoom, op: OpJoin}},
		{`{"op":"pub","room":"r","id":"` + long("x", 64) + `","body":1}`, want{op: OpPub, room: "r", id: long("x", 64), body: "1"}},
		{`{"op":"pub","room":"r","id":"` + long("x", 65) + `","body":1}`, want{err: ErrBadID, op: OpPub, room: "r", body: "1"}},
		// 64 characters, not 64 bytes: escaped or raw, in 2 and 4 bytes each.
		{`{"op":"pub","room":"r","id":"` + long(`\u00e9`, 64) + `","body":1}`, want{op: OpPub, room: "r", id: long("é", 64), body: "1"}},
		{`{"op":"pub","room":"r","id":"` + long(`\u00e9`, 65) + `","body":1}`, want{err: ErrBadID, op: OpPub, room: "r", body: "1"}},
		{`{"op":"pub","room":"r","id":"` + long(`\ud83d\ude00`, 64) + `","body":1}`, want{op: OpPub, room: "r", id: long("😀", 64), body: "1"}},
		{`{"op":"pub","room":"r","id":"` + long("😀", 64) + `","body":1}`, want{op: OpPub, room: "r", id: long("😀", 64), body: "1"}},
		{`{"op":"pub","room":"r","id":"` + long("😀", 65) + `","body":1}`, want{err: ErrBadID, op: OpPub, room: "r", body: "1"}},
		{`{"op":"pub","room":"r","id":"","body":1}`, want{err: ErrBadID, op: OpPub, room: "r", body: "1"}},
		{`{"op":"pub","room":"r","id":7,"body":1}`, want{err: ErrBadID, op: OpPub, room: "r", body: "1"}},

		// Op.
		{`{}`, want{err: ErrMissingOp}},
		{`{"room":"r"}`, want{err: ErrMissingOp, room: "r"}},
		{`{"op":"JOIN","room":"r"}`, want{err: ErrUnknownOp, room: "r"}},
		{`{"op":"msg"}`, want{err: ErrUnknownOp}},
		{`{"op":1}`, want{err: ErrUnknownOp}},
		{`{"op":"joinx","room":"r"}`, want{err: ErrUnknownOp, room: "r"}},
		{`{"op":"history2"}`, want{err: ErrUnknownOp}},

		// Required fields.
		{`{"op":"join"}`, want{err: ErrMissingRoom, op: OpJoin}},
		{`{"op":"leave"}`, want{err: ErrMissingRoom, op: OpLeave}},
		{`{"op":"history"}`, want{err: ErrMissingRoom, op: OpHistory, limit: 50}},
		{`{"op":"pub","id":"i","body":1}`, want{err: ErrMissingRoom, op: OpPub, id: "i", body: "1"}},
		{`{"op":"pub","room":"r","body":1}`, want{err: ErrMissingID, op: OpPub, room: "r", body: "1"}},
		{`{"op":"pub","room":"r","id":"i"}`, want{err: ErrMissingBody, op: OpPub, room: "r", id: "i"}},

		// Numbers.
		{`{"op":"join","room":"r","since":0}`, want{op: OpJoin, room: "r", has: "s"}},
		{`{"op":"join","room":"r","since":18446744073709551615}`, want{op: OpJoin, room: "r", since: 1<<64 - 1, has: "s"}},
		{`{"op":"join","room":"r","since":18446744073709551616}`, want{err: ErrBadNumber, op: OpJoin, room: "r"}},
		{`{"op":"join","room":"r","since":-1}`, want{err: ErrBadNumber, op: OpJoin, room: "r"}},
		{`{"op":"join","room":"r","since":-0}`, want{err: ErrBadNumber, op: OpJoin, room: "r"}},
		{`{"op":"join","room":"r","since":1.0}`, want{err: ErrBadNumber, op: OpJoin, room: "r"}},
		{`{"op":"join","room":"r","since":1e2}`, want{err: ErrBadNumber, op: OpJoin, room: "r"}},
		{`{"op":"join","room":"r","since":"1"}`, want{err: ErrBadNumber, op: OpJoin, room: "r"}},
		{`{"op":"join","room":"r","since":null}`, want{err: ErrBadNumber, op: OpJoin, room: "r"}},
		{`{"op":"history","room":"r","before":-5}`, want{err: ErrBadNumber, op: OpHistory, room: "r", limit: 50}},
		{`{"op":"history","room":"r","limit":1.5}`, want{err: ErrBadNumber, op: OpHistory, room: "r", limit: 50}},
		{`{"op":"history","room":"r","limit":0}`, want{err: ErrBadLimit, op: OpHistory, room: "r", has: "l"}},
		{`{"op":"history","room":"r","limit":1}`, want{op: OpHistory, room: "r", limit: 1, has: "l"}},
		{`{"op":"history","room":"r","limit":1000}`, want{op: OpHistory, room: "r", limit: 1000, has: "l"}},
		{`{"op":"history","room":"r","limit":1001}`, want{op: OpHistory, room: "r", limit: 1000, has: "l"}},
		{`{"op":"history","room":"r","limit":99999999999999999999}`, want{err: ErrBadNumber, op: OpHistory, room: "r", limit: 50}},

		// Precedence: op, then room, id, numbers, then required fields.
		{`{"op":"nope","room":"bad room","since":-1}`, want{err: ErrUnknownOp}},
		{`{"op":"pub","room":"bad room","id":"","since":-1}`, want{err: ErrBadRoom, op: OpPub}},
		{`{"op":"pub","id":"","since":-1}`, want{err: ErrBadID, op: OpPub}},
		{`{"op":"pub","room":"r","since":-1}`, want{err: ErrBadNumber, op: OpPub, room: "r"}},

		// Malformed: not JSON, not an object, trailing data.
		{``, want{err: ErrMalformed}},
		{`  `, want{err: ErrMalformed}},
		{`[]`, want{err: ErrMalformed}},
		{`"op"`, want{err: ErrMalformed}},
		{`null`, want{err: ErrMalformed}},
		{`{`, want{err: ErrMalformed}},
		{`{"op":"ping"`, want{err: ErrMalformed}},
		{`{"op":"ping",}`, want{err: ErrMalformed}},
		{`{"op":"ping"}{}`, want{err: ErrMalformed}},
		{`{"op":"ping"} x`, want{err: ErrMalformed}},
		{`{"op" "ping"}`, want{err: ErrMalformed}},
		{`{op:"ping"}`, want{err: ErrMalformed}},
		{`{'op':'ping'}`, want{err: ErrMalformed}},
		{"{\"op\":\"ping\"}\f", want{err: ErrMalformed}},
		{"{\"op\":\"pi\tng\"}", want{err: ErrMalformed}},
		{`{"op":"ping","x":"\x"}`, want{err: ErrMalformed}},
		{`{"op":"ping","x":"\u12"}`, want{err: ErrMalformed}},
		{`{"op":"ping","x":"\u12g4"}`, want{err: ErrMalformed}},
		{`{"op":"ping","x":01}`, want{err: ErrMalformed}},
		{`{"op":"ping","x":1.}`, want{err: ErrMalformed}},
		{`{"op":"ping","x":.1}`, want{err: ErrMalformed}},
		{`{"op":"ping","x":1e}`, want{err: ErrMalformed}},
		{`{"op":"ping","x":+1}`, want{err: ErrMalformed}},
		{`{"op":"ping","x":-}`, want{err: ErrMalformed}},
		{`{"op":"ping","x":NaN}`, want{err: ErrMalformed}},
		{`{"op":"ping","x":tru}`, want{err: ErrMalformed}},
		{`{"op":"ping","x":[1,]}`, want{err: ErrMalformed}},
		{`{"op":"ping","x":[1 2]}`, want{err: ErrMalformed}},
		{`{"op":"ping","x":{"a":1,}}`, want{err: ErrMalformed}},
		{`{"op":"ping","x":{"a"}}`, want{err: ErrMalformed}},
		{`{"op":"ping","x":{1:2}}`, want{err: ErrMalformed}},
		{`{"op":"ping","x":[}`, want{err: ErrMalformed}},
		{`{"op":"ping","x":{]}`, want{err: ErrMalformed}},
		{`{"op":"pub","room":"r","id":"i","body":}`, want{err: ErrMalformed}},
		{`{"op":"join","room":"r","since":01}`, want{err: ErrMalformed}},
		{`{"op":"join","room":"r","since":1x}`, want{err: ErrMalformed}},
		{"{\"op\":\"ping\",\"x\":\"\x1f\"}", want{err: ErrMalformed}},
	}
	var cmd Command
	for _, tt := range tests {
		err := Decode([]byte(tt.in), &cmd)
		if err != tt.err {
			t.Errorf("Decode(%q) error = %v, want %v", tt.in, err, tt.err)
			continue
		}
		if err == ErrMalformed {
			continue
		}
		has := ""
		if cmd.HasSince {
			has += "s"
		}
		if cmd.HasBefore {
			has += "b"
		}
		if cmd.HasLimit {
			has += "l"
		}
		got := want{err, cmd.Op, string(cmd.Room), string(cmd.ID), string(cmd.Body), cmd.Since, cmd.Before, cmd.Limit, has}
		if got != tt.want {
			t.Errorf("Decode(%q) =\n %+v, want\n %+v", tt.in, got, tt.want)
		}
	}
}

// TestDecodeResets fills every exported field and checks Decode clears
// them all, so a field added to Command is not left out of reset.
func TestDecodeAuthToken(t *testing.T) {
	var cmd Command
	if err := Decode([]byte(`{"token":"h.p.s","op":"auth"}`), &cmd); err != nil || cmd.Op != OpAuth || string(cmd.Token) != "h.p.s" {
		t.Fatalf("err %v op %v token %q", err, cmd.Op, cmd.Token)
	}
	if err := Decode([]byte(`{"op":"ping"}`), &cmd); err != nil || cmd.Token != nil {
		t.Fatalf("token not reset: %q", cmd.Token)
	}
}

func TestDecodeResets(t *testing.T) {
	var cmd Command
	v := reflect.ValueOf(&cmd).Elem()
	for k := 0; k < v.NumField(); k++ {
		f := v.Field(k)
		if !v.Type().Field(k).IsExported() {
			continue
		}
		switch f.Kind() {
		case reflect.Slice:
			f.SetBytes([]byte("x"))
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Int:
			f.SetInt(7)
		case reflect.Uint8, reflect.Uint64:
			f.SetUint(3)
		default:
			t.Fatalf("field %s: kind %v not covered", v.Type().Field(k).Name, f.Kind())
		}
	}
	if err := Decode([]byte(`{"op":"ping"}`), &cmd); err != nil {
		t.Fatal(err)
	}
	for k := 0; k < v.NumField(); k++ {
		name := v.Type().Field(k).Name
		if v.Type().Field(k).IsExported() && name != "Op" && !v.Field(k).IsZero() {
			t.Errorf("Decode did not reset %s", name)
		}
	}
}

func TestRef(t *testing.T) {
	var cmd Command
	if err := Decode([]byte(`{"op":"pub","room":"r","id":"m-1"}`), &cmd); err != ErrMissingBody {
		t.Fatal(err)
	}
	if string(Ref(&cmd)) != "m-1" {
		t.Fatalf("Ref = %q", Ref(&cmd))
	}
	if err := Decode([]byte(`{"op":"history","room":"r","limit":0}`), &cmd); err != ErrBadLimit {
		t.Fatal(err)
	}
	if string(Ref(&cmd)) != "r" {
		t.Fatalf("Ref = %q", Ref(&cmd))
	}
}

func TestErrorCodes(t *testing.T) {
	for _, e := range []*Error{ErrMissingOp, ErrUnknownOp, ErrMissingRoom, ErrBadRoom, ErrMissingID, ErrBadID, ErrMissingBody, ErrBadNumber, ErrBadLimit} {
		if e.Code != CodeBadRequest || e.Error() == "" {
			t.Errorf("%+v", e)
		}
	}
}

// TestDecodeDepth pins the nesting limit at sonic's: 4096 containers.
func TestDecodeDepth(t *testing.T) {
	var cmd Command
	for _, d := range []int{63, 64, 65, 200, 4094, 4095, 4096} {
		body := strings.Repeat(`[{"a":`, d/2) + strings.Repeat("[", d%2) + "1" + strings.Repeat("]", d%2) + strings.Repeat("}]", d/2)
		in := `{"op":"pub","room":"r","id":"i","body":` + body + `}`
		err := Decode([]byte(in), &cmd)
		wantOK := d+1 <= MaxDepth
		if (err == nil) != wantOK || !wantOK && err != ErrTooDeep {
			t.Errorf("depth %d: err = %v", d+1, err)
		}
		// The API checks a body on its own, inside its request object.
		if err := CheckValue([]byte(" "+body+"\n"), 1); (err == nil) != wantOK || !wantOK && err != ErrTooDeep {
			t.Errorf("depth %d: CheckValue = %v", d+1, err)
		}
		if err == nil && string(cmd.Body) != body {
			t.Errorf("depth %d: body mismatch", d+1)
		}
		if sonic.Valid([]byte(in)) != wantOK {
			t.Errorf("depth %d: sonic disagrees", d+1)
		}
	}
}

// TestDecodeTooDeep: too deep is a client error answered on the
// connection, whatever else the frame holds after the point where the
// limit was passed; bad syntax before it stays malformed.
func TestDecodeTooDeep(t *testing.T) {
	var cmd Command
	deep := strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth)
	for in, want := range map[string]error{
		`{"op":"pub","room":"r","id":"i","body":` + deep + `}`:              ErrTooDeep,
		`{"op":"pub","room":"r","id":"i","body":` + deep + `,"x":tru}`:      ErrTooDeep,
		`{"op":"pub","room":"r","id":"i","body":` + deep[:MaxDepth+1] + `}`: ErrTooDeep, // unterminated past the limit
		`{"op":"pub","room":"r","id":"i","x":tru,"body":` + deep + `}`:      ErrMalformed,
		deep: ErrMalformed, // not an object
		`{"op":"pub","room":"r","id":"i","body":` + deep[1:len(deep)-1] + `}`: nil,
	} {
		if err := Decode([]byte(in), &cmd); err != want {
			t.Errorf("Decode(%.60q...) = %v, want %v", in, err, want)
		}
	}
	for in, want := range map[string]error{"[1]": nil, " {} ": nil, "[1] x": ErrMalformed, "": ErrMalformed, deep: ErrTooDeep} {
		if err := CheckValue([]byte(in), 1); err != want {
			t.Errorf("CheckValue(%.30q) = %v, want %v", in, err, want)
		}
	}
}

// jsonDepth is the container nesting of a valid-looking input, ignoring
// strings; used to skip differential checks beyond the chosen limit.
func jsonDepth(b []byte) int {
	d, m, inStr := 0, 0, false
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch {
		case inStr && c == '\\':
			i++
		case c == '"':
			inStr = !inStr
		case !inStr && (c == '{' || c == '['):
			d++
			m = max(m, d)
		case !inStr && (c == '}' || c == ']'):
			d--
		}
	}
	return m
}

// checkDecodeOracle compares Decode's verdict on validity with
// encoding/json and, for objects, sonic's Unmarshal; it also checks the
// fields Decode extracted against encoding/json's reading.
func checkDecodeOracle(t *testing.T, in []byte) {
	t.Helper()
	var cmd Command
	err := Decode(in, &cmd)
	if !utf8.Valid(in) || jsonDepth(in) > MaxDepth-1 {
		return // the caller rejects invalid UTF-8; depth limits differ
	}
	trimmed := bytes.TrimLeft(in, " \t\r\n")
	isObj := json.Valid(in) && len(trimmed) > 0 && trimmed[0] == '{'
	if isObj != (err != ErrMalformed) {
		t.Fatalf("Decode(%q) = %v, encoding/json says object=%v", in, err, isObj)
	}
	// sonic is lax about raw control characters inside strings, so it is
	// held to both directions only when there are none.
	var sm map[string]any
	sonicOK := sonicNumbers.Unmarshal(in, &sm) == nil && sm != nil
	if isObj && !sonicOK {
		t.Fatalf("sonic rejects %q which encoding/json and Decode accept", in)
	}
	if !isObj && sonicOK && !bytes.ContainsFunc(in, func(r rune) bool { return r < 0x20 }) {
		t.Fatalf("sonic accepts %q which encoding/json and Decode reject", in)
	}
	if !isObj {
		return
	}
	var m map[string]json.RawMessage
	if e := json.Unmarshal(in, &m); e != nil {
		t.Fatalf("encoding/json: %v", e)
	}
	if raw, ok := m["body"]; ok && err != ErrMalformed && cmd.Body != nil && !bytes.Equal(raw, cmd.Body) {
		// encoding/json keeps the last duplicate too, byte for byte.
		t.Fatalf("Decode(%q) body %q, encoding/json %q", in, cmd.Body, raw)
	}
	for key, got := range map[string][]byte{"room": cmd.Room, "id": cmd.ID, "epoch": cmd.Epoch, "token": cmd.Token} {
		if got == nil {
			continue
		}
		var s string
		if e := json.Unmarshal(m[key], &s); e != nil || s != string(got) {
			t.Fatalf("Decode(%q) %s %q, encoding/json %q (%v)", in, key, got, s, e)
		}
	}
}

// sonicNumbers keeps numbers as text: 1E700 is valid JSON but overflows a
// float64, and that is not what the oracle is asked.
var sonicNumbers = sonic.Config{UseNumber: true}.Froze()

func FuzzDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, in []byte) {
		checkDecodeOracle(t, in)
	})
}

func TestDecodeAllocs(t *testing.T) {
	inputs := [][]byte{
		[]byte(pubPayload(100)),
		[]byte(`{"op":"join","room":"lob\u0062y","since":41}`),
		[]byte(`{"op":"pub","room":"r","id":"\u00e9\u00e9","body":[` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `]}`),
		[]byte(`{"op":"history","room":"r","limit":0}`),
		[]byte(`{"op":"ping",}`),
		[]byte(`{"op":"auth","token":"eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ1In0.c2ln"}`),
	}
	var cmd Command
	for _, in := range inputs {
		if a := testing.AllocsPerRun(100, func() { _ = Decode(in, &cmd) }); a != 0 {
			t.Errorf("Decode(%q) allocates %v times", in, a)
		}
	}
}

func pubPayload(bodyLen int) string {
	return `{"op":"pub","room":"lobby","id":"m-12345","body":{"text":"` + strings.Repeat("x", bodyLen-11) + `"}}`
}

var sinkErr error

func BenchmarkDecodePub(b *testing.B) {
	in := []byte(pubPayload(100))
	var cmd Command
	b.ReportAllocs()
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		sinkErr = Decode(in, &cmd)
	}
	if sinkErr != nil || len(cmd.Body) != 100 {
		b.Fatal(sinkErr, len(cmd.Body))
	}
}

func BenchmarkDecodeJoin(b *testing.B) {
	in := []byte(`{"op":"join","room":"lobby","since":41}`)
	var cmd Command
	b.ReportAllocs()
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		sinkErr = Decode(in, &cmd)
	}
}

var sinkBool bool

// BenchmarkSonicValidPub is the alternative considered: sonic's validator
// alone (not strict, and a second pass would still be needed for fields).
func BenchmarkSonicValidPub(b *testing.B) {
	in := []byte(pubPayload(100))
	b.ReportAllocs()
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		sinkBool = sonic.Valid(in)
	}
}

func BenchmarkJSONValidPub(b *testing.B) {
	in := []byte(pubPayload(100))
	b.ReportAllocs()
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		sinkBool = json.Valid(in)
	}
}

// TestDecodeOracleFragments runs the differential check over hand-picked
// fragments, valid and not, placed as an unknown field and as the body.
func TestDecodeOracleFragments(t *testing.T) {
	frags := []string{
		`0`, `-0`, `-0.0`, `1e0`, `1E+2`, `1e-2`, `0.5e10`, `123456789012345678901234567890`, `01`, `-`, `1.`, `.5`, `1e`, `1e+`, `+1`, `0x10`, `Infinity`, `NaN`,
		`""`, `"\u00e9"`, `"\uD83D\uDE00"`, `"\ud800"`, `"\/"`, `"\a"`, `"\u00G0"`, `"\u00e"`, "\"\x7f\"", "\"\x00\"", "\"\t\"", `"é😀"`,
		`true`, `false`, `null`, `True`, `nul`, `nulll`, `[]`, `{}`, `[ ]`, `{ }`, `[,]`, `[1,,2]`, `{"a":1,"a":2}`, `{"a" 1}`, `{"a":}`, `{,}`,
		`[[[[[]]]]]`, `[{"":[{"":{}}]}]`, `[1}`, `{"a":1]`, `[`, `]`, `{"a":[1,2,{"b":null}],"c":"d"}`,
	}
	for _, fr := range frags {
		for _, in := range []string{
			`{"op":"ping","x":` + fr + `}`,
			`{"op":"pub","room":"r","id":"i","body":` + fr + `}`,
			`{"op":"pub","room":"r","id":` + fr + `,"body":1}`,
			`{"op":"join","room":` + fr + `}`,
			fr,
		} {
			checkDecodeOracle(t, []byte(in))
		}
	}
}

// TestScanStringSWAR puts each kind of stop byte at every offset around the
// 8-byte fast path, next to bytes that could fool it (0x20, 0x7f, 0x80+).
func TestScanStringSWAR(t *testing.T) {
	naive := func(b []byte) (int, bool) {
		for i := 0; i < len(b); i++ {
			switch c := b[i]; {
			case c == '"':
				return i, true
			case c == '\\':
				i++ // every escape in this test is \\ or \"
			case c < 0x20:
				return i, false
			}
		}
		return len(b), false
	}
	fill := []byte(" \x7f\x80\xff!#[]~\xc3\xa9")
	for _, stop := range []string{`"`, `\\`, `\"`, "\x00", "\x01", "\x1f"} {
		for pos := 0; pos < 24; pos++ {
			for tail := 0; tail < 10; tail++ {
				var b []byte
				for k := 0; k < pos; k++ {
					b = append(b, fill[k%len(fill)])
				}
				b = append(b, stop...)
				for k := 0; k < tail; k++ {
					b = append(b, fill[(k+3)%len(fill)])
				}
				end, _, ok := scanString(b, 0)
				wend, wok := naive(b)
				if ok != wok || (ok && end != wend) {
					t.Fatalf("%q: scanString = %d %v, want %d %v", b, end, ok, wend, wok)
				}
			}
		}
	}
}
