package persist

import (
	"context"
	"fmt"
	"testing"

	"github.com/roost-chat/roost/proto"
)

func TestMemoryContract(t *testing.T) {
	testStoreContract(t, func(t *testing.T) Store { return NewMemory(0) })
}

func TestMemoryKeepWindow(t *testing.T) {
	ctx := context.Background()
	st := NewMemory(3)
	k := proto.RoomKey("app1", "r")
	fill(t, st, k, 5) // keeps m3..m5
	msgs, err := st.Range(ctx, k, 0, 10, 10)
	if err != nil {
		t.Fatal(err)
	}
	wantSeqs(t, "Range", msgs, 3, 5)
	msgs, _ = st.History(ctx, k, 0, 10)
	wantSeqs(t, "History", msgs, 3, 5)
	msgs, _ = st.History(ctx, k, 4, 10)
	wantSeqs(t, "History(4)", msgs, 3, 3)

	res := commit(t, st, req(k, "u", "m4", `dup`), req(k, "u", "m1", `again`))
	if !res[0].Duplicate || res[0].Seq != 4 {
		t.Fatalf("kept key: %+v, want duplicate of 4", res[0])
	}
	// m1 left the window with its message, so it is stored anew.
	if res[1].Duplicate || res[1].Seq != 6 {
		t.Fatalf("evicted key: %+v, want new seq 6", res[1])
	}
	// m3 was evicted by seq 6: its key goes with it.
	if res := commit(t, st, req(k, "u", "m3", `x`)); res[0].Duplicate || res[0].Seq != 7 {
		t.Fatalf("evicted m3: %+v", res[0])
	}
	if last, _ := st.LastSeq(ctx, k); last != 7 {
		t.Fatalf("LastSeq = %d", last)
	}
	for i := 0; i < 100; i++ {
		commit(t, st, req(k, "u", fmt.Sprint("n", i), `1`))
	}
	for i := range st.shards {
		sh := &st.shards[i]
		for _, r := range sh.rooms {
			if len(r.idem) != 3 || len(r.ring) != 3 {
				t.Fatalf("room holds %d keys, %d entries; want 3", len(r.idem), len(r.ring))
			}
		}
	}
}
