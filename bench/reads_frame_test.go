//go:build linux

package bench

import (
	"bytes"
	"strings"
	"testing"

	"github.com/gobwas/ws"
)

// The reads bench's frames read back as the text sent, at each length
// encoding, masked as a client's must be.
func TestAppendClientText(t *testing.T) {
	for _, n := range []int{0, 13, 125, 126, 1000, 70000} {
		body := []byte(strings.Repeat("x", n))
		r := bytes.NewReader(appendClientText(nil, body))
		h, err := ws.ReadHeader(r)
		if err != nil {
			t.Fatal(n, err)
		}
		if !h.Fin || h.OpCode != ws.OpText || !h.Masked || h.Length != int64(n) || int64(r.Len()) != h.Length {
			t.Fatalf("%d: header %+v, %d bytes after it", n, h, r.Len())
		}
		payload := make([]byte, r.Len())
		_, _ = r.Read(payload)
		ws.Cipher(payload, h.Mask, 0)
		if !bytes.Equal(payload, body) {
			t.Fatalf("%d: payload differs", n)
		}
	}
}

// A pong echoes the ping's payload in a masked client frame.
func TestAppendClientFramePong(t *testing.T) {
	r := bytes.NewReader(appendClientFrame(nil, ws.OpPong, []byte("hi")))
	h, err := ws.ReadHeader(r)
	if err != nil {
		t.Fatal(err)
	}
	if !h.Fin || h.OpCode != ws.OpPong || !h.Masked || h.Length != 2 {
		t.Fatalf("header %+v", h)
	}
	p := make([]byte, 2)
	_, _ = r.Read(p)
	ws.Cipher(p, h.Mask, 0)
	if string(p) != "hi" {
		t.Fatalf("payload %q", p)
	}
}
