package proto

import (
	"strings"
	"testing"
)

func TestFrameTS(t *testing.T) {
	f := AppendMsgFrame(nil, "r", 64, []byte(`a,"ts":1`), `b",ts":2`, 1764484800123, []byte(`{"ts":5}`))
	if ts, ok := FrameTS(f); !ok || ts != 1764484800123 {
		t.Fatalf("ts %d %v from %q", ts, ok, f)
	}
	if _, ok := FrameTS([]byte(`{"op":"msg"}`)); ok {
		t.Fatal("ts found where there is none")
	}
}

func TestRoomKeySplits(t *testing.T) {
	for _, tc := range []struct{ app, room string }{{"a", "r"}, {"my.app-1", "x:y.z"}, {"", "r"}} {
		app, room := SplitKey(RoomKey(tc.app, tc.room))
		if app != tc.app || room != tc.room {
			t.Fatalf("%q %q split into %q %q", tc.app, tc.room, app, room)
		}
	}
	if app, room := SplitKey("noslash"); app != "" || room != "noslash" {
		t.Fatalf("split of a bare room: %q %q", app, room)
	}
}

func TestValidAppIDAndUser(t *testing.T) {
	for id, ok := range map[string]bool{"demo": true, "a.b-c_D9": true, "": false, "a/b": false, "a b": false, string(make([]byte, 65)): false} {
		if ValidAppID([]byte(id)) != ok {
			t.Fatalf("ValidAppID(%q) != %v", id, ok)
		}
	}
	for user, ok := range map[string]bool{
		"":                             false,
		"u":                            true,
		strings.Repeat("a", MaxUser):   true,
		strings.Repeat("a", MaxUser+1): false,
		strings.Repeat("é", MaxUser):   true, // characters, not bytes
		strings.Repeat("é", MaxUser+1): false,
		strings.Repeat("😀", MaxUser):   true,
		"ev\x00il":                     false,
		"ev\xffil":                     false, // not UTF-8
		"\xed\xa0\x80":                 false, // a surrogate in UTF-8
		"tab\tin":                      false,
		"del\x7f":                      false,
		"c1\u0085":                     false,
		"alice@example.com":            true,
		"Zoë Smith":                    true,
		"日本語":                          true,
	} {
		if ValidUser([]byte(user)) != ok {
			t.Errorf("ValidUser(%q) = %v, want %v", user, !ok, ok)
		}
	}
	for id, ok := range map[string]bool{
		"":                           false,
		"m-1":                        true,
		strings.Repeat("x", MaxID):   true,
		strings.Repeat("x", MaxID+1): false,
		strings.Repeat("ü", MaxID):   true,
		strings.Repeat("ü", MaxID+1): false,
		strings.Repeat("😀", MaxID):   true,
		"nul\x00ok":                  true, // stored as bytes, escaped on the wire
	} {
		if ValidID([]byte(id)) != ok {
			t.Errorf("ValidID(%q) = %v, want %v", id, !ok, ok)
		}
	}
}
