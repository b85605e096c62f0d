package test

// The drain contract of the real binary under SIGTERM.

import (
	"context"
	"fmt"
	"regexp"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/persist/pgtest"
	"github.com/roost-chat/roost/proto"
	"github.com/roost-chat/roost/proto/prototest"
	"github.com/roost-chat/roost/test/harness"
)

// TestDrainOnSIGTERM runs the real binary on PostgreSQL with members
// publishing, sends SIGTERM and checks the drain contract: exit 0 within
// the window, every member closed with 1001 and a retry hint, every
// publish answered (ack or err overloaded) before its close frame, and the
// acknowledged publishes exactly the stored ones.
func TestDrainOnSIGTERM(t *testing.T) {
	dbURL := pgtest.NewDB(t)
	const window = 2 * time.Second
	n := harness.Start(t, harness.Spec{Args: []string{"--insecure", "--api", "off", "--database-url", dbURL, "--migrate",
		"--loops", "2", "--drain", window.String(), "--flush", "1ms", "--log-format", "json"}})
	addr := n.Addr

	// Members join, then publish with up to 4 publishes outstanding each.
	const members = 12
	type result struct {
		user      string
		acked     map[string]uint64 // id -> seq
		sent      int
		overload  int
		other     []string
		closeCode int
		reason    string
		answered  int
	}
	results := make([]*result, members)
	clients := make([]*prototest.Client, members)
	for i := range clients {
		user := fmt.Sprintf("u%d", i)
		clients[i] = prototest.DialT(t, "ws://"+addr+"/ws?user="+user+"&app=dr", prototest.Options{})
		results[i] = &result{user: user, acked: map[string]uint64{}}
		if err := clients[i].Send(`{"op":"join","room":"r"}`); err != nil {
			t.Fatal(err)
		}
	}
	var acks sync.WaitGroup
	acks.Add(members * 5) // SIGTERM once every member has 5 acks
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := results[i]
			credit := 4
			acked := 0
			broken := false // the node closed: stop writing
			sendOne := func() {
				if c.Send(fmt.Sprintf(`{"op":"pub","room":"r","id":"%s-%d","body":%d}`, r.user, r.sent, r.sent)) != nil {
					broken = true
					return
				}
				r.sent++
				credit--
			}
			for credit > 0 && !broken {
				sendOne()
			}
			for f := range c.Frames() {
				m := f.Map()
				switch {
				case f.Op == ws.OpClose:
					r.closeCode, r.reason = f.Code, f.Reason
				case f.Op != ws.OpText:
				case m["op"] == "ack":
					r.acked[m["id"].(string)] = uint64(m["seq"].(float64))
					r.answered++
					if acked++; acked <= 5 {
						acks.Done()
					}
					credit++
				case m["op"] == "err" && m["code"] == "overloaded":
					r.overload++
					r.answered++
					credit++
				case m["op"] == "err":
					r.other = append(r.other, string(f.Data))
					r.answered++
					credit++
				}
				for credit > 0 && r.overload == 0 && !broken {
					sendOne()
				}
			}
		}()
	}
	acks.Wait()
	sigAt := time.Now()
	if err := n.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-n.Done():
		if st := n.Cmd.ProcessState; !st.Success() {
			t.Fatalf("roost exited with %v, want 0", st)
		}
	case <-time.After(window + 10*time.Second):
		t.Fatalf("roost did not exit within %s of SIGTERM", window+10*time.Second)
	}
	took := time.Since(sigAt)
	wg.Wait()
	// The window bounds the closing; stopping the loops and pools after it
	// takes well under a second more.
	if took > window+2*time.Second {
		t.Errorf("exit %s after SIGTERM, want within the %s window (+2s)", took, window)
	}

	stored := map[string]uint64{}
	st, err := persist.OpenPostgres(context.Background(), dbURL, persist.PGConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	msgs, _, err := st.History(context.Background(), proto.RoomKey("dr", "r"), 0, persist.Bounds{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		stored[m.ID] = m.Seq
	}
	totalAcked := 0
	for _, r := range results {
		if r.closeCode != 1001 || !regexp.MustCompile(`^retry=[0-9]+$`).MatchString(r.reason) {
			t.Errorf("%s: close %d %q, want 1001 retry=MS", r.user, r.closeCode, r.reason)
		}
		if len(r.other) > 0 {
			t.Errorf("%s: unexpected errors %v", r.user, r.other)
		}
		// At most the publishes written after the node sent its close go
		// unanswered (the node reads nothing after its close frame).
		if r.sent-r.answered > 4 {
			t.Errorf("%s: %d publishes sent, %d answered", r.user, r.sent, r.answered)
		}
		for id, seq := range r.acked {
			if stored[id] != seq {
				t.Errorf("%s: ack %s seq %d, stored seq %d", r.user, id, seq, stored[id])
			}
		}
		totalAcked += len(r.acked)
	}
	if len(stored) != totalAcked {
		t.Errorf("%d messages stored, %d acknowledged: a publish in flight was committed without its ack", len(stored), totalAcked)
	}
	t.Logf("drain: %d members, %d acked, %d stored, exit after %s", members, totalAcked, len(stored), took.Round(time.Millisecond))
}
