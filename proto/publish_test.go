package proto

import "testing"

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
	if ValidUser(nil) || !ValidUser([]byte("u")) || ValidUser(make([]byte, MaxUser+1)) || !ValidUser(make([]byte, MaxUser)) {
		t.Fatal("ValidUser bounds")
	}
}
