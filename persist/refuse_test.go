package persist

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/roost-chat/roost/proto"
)

type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A batch holding publishes that PostgreSQL refuses (a NUL or invalid
// UTF-8 in the sender, a NUL in a new room's name) commits everybody
// else's: only the bad requests fail, each logged with the reason, and the
// others keep their order and consecutive seqs.
func TestPoolSplitsBatchAroundRefusedPublish(t *testing.T) {
	st := newPG(t)
	sink := newAckSink()
	var logs lockedBuf
	p := NewPool(st, sink, PoolConfig{Workers: 1, MaxBatch: 300, Window: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	bad := map[int]*proto.PubRequest{
		17:  newReq("app/r1", "ev\x00il", "b1", `1`),
		150: newReq("app/r2", "bad\xffutf8", "b2", `2`),
		299: newReq("app/ro\x00om", "u", "b3", `3`),
	}
	for i := 0; i < 300; i++ {
		req := bad[i]
		if req == nil {
			req = newReq(fmt.Sprintf("app/r%d", i%3), fmt.Sprintf("user%d", i%7), fmt.Sprint("m", i), fmt.Sprintf(`{"i":%d}`, i))
		}
		if err := p.Submit(req); err != nil {
			t.Fatal(err)
		}
	}
	p.Close()
	sink.check(t)
	if sink.errs != 3 {
		t.Errorf("%d publishes failed, want the 3 bad ones", sink.errs)
	}
	if got := len(sink.acks); got != 297 {
		t.Errorf("%d publishes stored, want 297", got)
	}
	for _, id := range []string{"app/r1|ev\x00il|b1", "app/r2|bad\xffutf8|b2", "app/ro\x00om|u|b3"} {
		if _, ok := sink.acks[id]; ok {
			t.Errorf("bad publish %q acknowledged", id)
		}
	}
	var n int
	for r := 0; r < 3; r++ {
		last := sink.lastNew[fmt.Sprintf("app/r%d", r)]
		n += int(last)
	}
	if n != 297 {
		t.Errorf("rooms' newest seqs sum to %d, want 297 (consecutive, nothing lost)", n)
	}
	if s := p.Stats(); s.Refused != 3 {
		t.Errorf("Stats().Refused = %d, want 3", s.Refused)
	}
	if l := logs.String(); !strings.Contains(l, "the store refused a publish") || !strings.Contains(l, `from="ev\x00il"`) || !strings.Contains(l, "SQLSTATE 22021") {
		t.Errorf("refusal not logged with the sender and reason:\n%s", l)
	}
}
