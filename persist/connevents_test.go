package persist

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/roost-chat/roost/proto"
)

// An app's delivered connection events are deleted once older than
// eventsKeep; those not delivered yet, and the newer ones, stay.
func TestTrimHookEvents(t *testing.T) {
	p := newPG(t)
	ctx := context.Background()
	key := proto.RoomKey("a", proto.EventsRoom)
	var rows []*Row
	for i := 1; i <= 4; i++ {
		rows = append(rows, &Row{Key: key, From: "roost", ID: []byte("ev-" + strconv.Itoa(i)), Body: proto.AppendConnEvent(nil, proto.EventOnline, "", "u"+strconv.Itoa(i), 1)})
	}
	if err := p.CommitBatch(ctx, rows); err != nil {
		t.Fatal(err)
	}
	id, _, err := p.HookRoomID(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.ClaimHookRooms(ctx, "n1", time.Minute, []int64{id}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.AdvanceHookRooms(ctx, "n1", time.Minute, []int64{id}, []uint64{3}, false); err != nil {
		t.Fatal(err)
	}
	if n, err := p.TrimHookEvents(ctx, "a", 100); err != nil || n != 0 {
		t.Fatalf("fresh events trimmed: %d %v", n, err)
	}
	if _, err := p.pool.Exec(ctx, `UPDATE messages SET ts = now() - interval '1 hour' WHERE room_id = $1 AND seq <> 2`, id); err != nil {
		t.Fatal(err)
	}
	if n, err := p.TrimHookEvents(ctx, "a", 100); err != nil || n != 2 {
		t.Fatalf("trimmed %d %v, want seqs 1 and 3", n, err)
	}
	msgs, _, err := p.Range(ctx, key, 0, 10, Bounds{Limit: 10})
	if err != nil || len(msgs) != 2 || msgs[0].Seq != 2 || msgs[1].Seq != 4 {
		t.Fatalf("left %v %+v", err, msgs)
	}
}
