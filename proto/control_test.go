package proto

import (
	"bytes"
	"testing"
)

func TestControlRoundTrip(t *testing.T) {
	in := Control{Op: ControlDisconnect, App: "chat", User: "alice 🦉/x"}
	var out Control
	if err := ParseControl(AppendControl(nil, &in), &out); err != nil || out != in {
		t.Fatalf("round trip: %+v, %v", out, err)
	}
	for _, bad := range []string{"", "disconnect", "disconnect\x00chat", "kick\x00chat\x00alice", "disconnect\x00c/t\x00alice",
		"disconnect\x00chat\x00", "disconnect\x00chat\x00a\x00b", "disconnect\x00chat\x00a\x1fb", "disconnect\x00chat\x00\xff"} {
		if err := ParseControl([]byte(bad), &out); err == nil {
			t.Errorf("ParseControl(%q) accepted", bad)
		}
	}
}

// FuzzParseControl: control messages arrive from the broker, so any bytes
// must be refused or round-trip exactly.
func FuzzParseControl(f *testing.F) {
	f.Add([]byte("disconnect\x00chat\x00alice"))
	f.Add([]byte("disconnect\x00\x00"))
	f.Add([]byte("\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var c Control
		if ParseControl(b, &c) != nil {
			return
		}
		if got := AppendControl(nil, &c); !bytes.Equal(got, b) {
			t.Fatalf("%q parsed as %+v, which encodes as %q", b, c, got)
		}
	})
}
