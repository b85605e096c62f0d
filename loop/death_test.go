package loop

import (
	"context"
	"testing"
	"time"
)

// When the engine ends on its own (as when accept fails), the server says
// it is dead and a drain returns at once: it used to wait forever for
// tasks pushed to loops that no longer run.
func TestDrainAfterEngineDeath(t *testing.T) {
	n := startNode(t, nil)
	c := n.dial(t, "alice")
	c.send(`{"op":"join","room":"r"}`)
	c.expect(map[string]any{"op": "joined"})
	if n.srv.Dead() {
		t.Fatal("Dead before anything failed")
	}
	// The engine stops without Server.Stop: what gnet does when a loop fails.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = n.srv.eng.Stop(ctx)
	select {
	case <-n.srv.Stopped():
	case <-time.After(5 * time.Second):
		t.Fatal("engine did not stop")
	}
	if !n.srv.Dead() {
		t.Fatal("Dead is false with the engine gone")
	}
	done := make(chan struct{})
	go func() {
		n.srv.Drain(1001, 2*time.Second)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(time.Second):
		t.Fatal("Drain waits on loops that are gone")
	}
}

// Stop is a shutdown, not a death.
func TestStopIsNotDeath(t *testing.T) {
	n := startNode(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n.fan.ClosePublishes()
	if err := n.srv.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if n.srv.Dead() {
		t.Fatal("Dead after Stop")
	}
}

func TestProcAddr(t *testing.T) {
	for h, want := range map[string]string{
		"0100007F":                         "127.0.0.1",
		"00000000":                         "0.0.0.0",
		"0200007F":                         "127.0.0.2",
		"00000000000000000000000001000000": "::1",
		"00000000000000000000000000000000": "::",
		"0000000000000000FFFF00000100007F": "127.0.0.1", // v4-mapped
	} {
		a, ok := procAddr(h)
		if !ok || a.String() != want {
			t.Errorf("procAddr(%s) = %v %v, want %s", h, a, ok, want)
		}
	}
}
