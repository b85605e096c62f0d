package loop

import (
	"testing"
	"time"

	"github.com/roost-chat/roost/proto"
)

// A rotation's previous secret ends the connections it signed when it
// expires, spread over retireSpread, unless they refreshed with a current
// one; a secret removed at once (rotate --keep-previous 0) ends them
// within the spread.
func TestRetiredSecretCloses(t *testing.T) {
	app := proto.App{ID: "a", Secret: secretA}
	n := secureNode(t, nil, app)
	var olds []*client
	for _, u := range []string{"u1", "u2", "u3", "u4"} {
		c := n.dialQuery(t, "token="+tok(secretA, "a", u, time.Now().Add(time.Hour)))
		c.send(`{"op":"ping"}`)
		c.expect(map[string]any{"op": "pong"})
		olds = append(olds, c)
	}
	kept := n.dialQuery(t, "token="+tok(secretA, "a", "kept", time.Now().Add(time.Hour)))
	kept.send(`{"op":"ping"}`)
	kept.expect(map[string]any{"op": "pong"})

	rotated := time.Now()
	app.PreviousSecret, app.PreviousUntil, app.Secret = secretA, rotated.Add(time.Second), secretB
	setApps(n.srv, []proto.App{app})
	kept.send(`{"op":"auth","token":"` + tok(secretB, "a", "kept", time.Now().Add(2*time.Hour)) + `"}`)
	if f := kept.recv(); f["op"] != "authed" {
		t.Fatalf("refresh with the new secret: %v", f)
	}
	// A new connection with the previous secret is still accepted, and
	// ends with the others.
	late := n.dialQuery(t, "token="+tok(secretA, "a", "late", time.Now().Add(time.Hour)))
	olds = append(olds, late)
	for i, c := range olds {
		if reason := c.expectClose(1008); reason != "token expired" {
			t.Fatalf("conn %d: reason %q", i, reason)
		}
		if d := time.Since(rotated); d < 900*time.Millisecond || d > time.Second+retireSpread+1500*time.Millisecond {
			t.Fatalf("conn %d closed %v after the rotation: want within the spread after 1 s", i, d)
		}
	}
	kept.send(`{"op":"ping"}`)
	kept.expect(map[string]any{"op": "pong"})

	// Removed at once: the refreshed connection's secret is now the
	// retired one.
	app.PreviousSecret, app.PreviousUntil, app.Secret = "", time.Time{}, secretA+"-third"
	setApps(n.srv, []proto.App{app})
	start := time.Now()
	if reason := kept.expectClose(1008); reason != "token expired" {
		t.Fatalf("reason %q", reason)
	}
	if d := time.Since(start); d > retireSpread+1500*time.Millisecond {
		t.Fatalf("closed %v after its secret was removed", d)
	}
}
