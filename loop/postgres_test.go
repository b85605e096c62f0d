package loop

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/persist/pgtest"
)

func openPG(t *testing.T, url string) *persist.Postgres {
	t.Helper()
	ctx := context.Background()
	if err := persist.Migrate(ctx, url); err != nil {
		t.Fatal(err)
	}
	pg, err := persist.OpenPostgres(ctx, url, persist.PGConfig{MaxConns: 8, StatementTimeout: 2 * time.Second, ResolveTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return pg
}

func pgNode(t *testing.T, url string) (*node, func()) {
	t.Helper()
	pg := openPG(t, url)
	n := startNodeWith(t, testConfig(), pg, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	stop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		n.fan.ClosePublishes()
		_ = n.srv.Stop(ctx)
		_ = n.fan.Close()
		pg.Close()
	}
	return n, stop
}

// Restart the node mid-stream: no acknowledged message is lost, and
// re-publishing acknowledged keys returns their original seq.
func TestPostgresRestartKeepsAcked(t *testing.T) {
	url := pgtest.NewDB(t)
	a, stopA := pgNode(t, url)
	pub := a.dial(t, "pub")
	const total = 40
	acked := map[string]uint64{}
	for i := 1; i <= total; i++ {
		pub.send(fmt.Sprintf(`{"op":"pub","room":"durable","id":"k%d","body":{"i":%d}}`, i, i))
	}
	for len(acked) < total {
		m := pub.expect(map[string]any{"op": "ack"})
		acked[m["id"].(string)] = num(m["seq"])
	}
	stopA()

	b, stopB := pgNode(t, url)
	defer stopB()
	again := b.dial(t, "pub") // same user: same idempotency scope
	for i := 1; i <= total; i += 7 {
		id := fmt.Sprintf("k%d", i)
		again.send(fmt.Sprintf(`{"op":"pub","room":"durable","id":"%s","body":{"i":%d}}`, id, i))
		again.expect(map[string]any{"op": "ack", "id": id, "seq": int(acked[id])})
	}
	j := b.dial(t, "reader")
	j.send(`{"op":"join","room":"durable","since":0}`)
	j.expect(map[string]any{"op": "joined", "seq": total})
	for seq := 1; seq <= total; seq++ {
		m := j.expect(map[string]any{"op": "msg", "seq": seq, "from": "pub"})
		if acked[m["id"].(string)] != uint64(seq) {
			t.Fatalf("seq %d has id %v, acked as %d", seq, m["id"], acked[m["id"].(string)])
		}
	}
	j.send(`{"op":"history","room":"durable","limit":5}`)
	h := j.expect(map[string]any{"op": "history"})
	msgs := h["messages"].([]any)
	if len(msgs) != 5 || num(msgs[4].(map[string]any)["seq"]) != total {
		t.Fatalf("history: %v", h)
	}
	// A new publish continues the sequence.
	again.send(`{"op":"pub","room":"durable","id":"new","body":null}`)
	again.expect(map[string]any{"op": "ack", "seq": total + 1})
	j.expect(map[string]any{"op": "msg", "seq": total + 1})
}

// PostgreSQL connections die during a publish burst: connections stay up,
// every publish is answered (ack or err overloaded, never an ack for
// something not stored), and the node recovers by itself.
func TestPostgresKilledBackends(t *testing.T) {
	url := pgtest.NewDB(t)
	n, stop := pgNode(t, url)
	defer stop()
	sub := n.dial(t, "sub")
	sub.send(`{"op":"join","room":"burst"}`)
	sub.expect(map[string]any{"op": "joined"})
	pub := n.dial(t, "pub")
	const total = 400
	go func() {
		for i := 1; i <= total; i++ {
			pub.send(fmt.Sprintf(`{"op":"pub","room":"burst","id":"k%d","body":%d}`, i, i))
			if i%100 == 0 {
				pgtest.Terminate(t, url)
			}
		}
	}()
	acked := map[uint64]string{}
	failed := 0
	for answered := 0; answered < total; answered++ {
		m := pub.recv()
		switch m["op"] {
		case "ack":
			acked[num(m["seq"])] = m["id"].(string)
		case "err":
			if m["code"] != "overloaded" {
				t.Fatalf("unexpected err: %v", m)
			}
			failed++
		default:
			t.Fatalf("unexpected frame: %v", m)
		}
	}
	t.Logf("%d acked, %d overloaded", len(acked), failed)
	// Retry the failed ones with the same ids until everything is stored.
	for round := 0; len(acked) < total && round < 20; round++ {
		have := map[string]bool{}
		for _, id := range acked {
			have[id] = true
		}
		want := 0
		for i := 1; i <= total; i++ {
			if id := fmt.Sprintf("k%d", i); !have[id] {
				pub.send(fmt.Sprintf(`{"op":"pub","room":"burst","id":"%s","body":%d}`, id, i))
				want++
			}
		}
		for ; want > 0; want-- {
			if m := pub.recv(); m["op"] == "ack" {
				acked[num(m["seq"])] = m["id"].(string)
			}
		}
	}
	if len(acked) != total {
		t.Fatalf("after retries %d of %d stored", len(acked), total)
	}
	// The subscriber stayed connected and saw exactly 1..total, no gap, no
	// duplicate, each with the id acked for that seq.
	for seq := uint64(1); seq <= total; seq++ {
		m := sub.expect(map[string]any{"op": "msg", "seq": int(seq)})
		if m["id"] != acked[seq] {
			t.Fatalf("seq %d: id %v, acked %v", seq, m["id"], acked[seq])
		}
	}
}
