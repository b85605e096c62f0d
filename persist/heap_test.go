package persist

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/roost-chat/roost/proto"
)

// backendFaults is the minor page faults of a PostgreSQL backend so far,
// from /proc (the server runs on this machine in CI).
func backendFaults(t *testing.T, pid int) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Skipf("PostgreSQL's backends are not on this machine: %v", err)
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	n, err := strconv.ParseUint(f[7], 10, 64) // minflt, field 10
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestPostgresCommitKeepsBackendHeap: a commit on a backend the store has
// warmed (warmBackendHeap) faults in far fewer pages than on a cold one,
// whose malloc gave the last commit's memory back to the kernel.
//
// Both counts carry the backend's first touches of shared buffers and WAL
// (about 8 a commit here), which the warming cannot save, so the bound is on
// the ratio with room for that floor: on a quiet machine warm/cold is
// 0.35-0.45, and with the heap given back it would be near 1. A CI run on a
// busy machine once measured 9.4 against 15.8 (0.59), so the pair is measured
// again, up to three times, before the test fails.
//
// Since migration 0007 (kinds: one more index per message) a cold backend
// measured here keeps its heap too (cold 8.3 against 23.5 before, warm 8-9
// against 5.7: the floor rose with the index's pages), so the ratio can
// no longer show the warming; a warmed backend that stays near the floor
// (floorBound, far below a heap given back) passes as well.
func TestPostgresCommitKeepsBackendHeap(t *testing.T) {
	const bound, floorBound = 0.7, 13
	var warm, cold float64
	for try := 1; try <= 3; try++ {
		warm = commitFaults(t, PGConfig{MaxConns: 1})
		cold = coldCommitFaults(t)
		t.Logf("try %d: minor faults per commit of 50 publishes: warm %.1f, cold %.1f", try, warm, cold)
		if warm <= cold*bound || warm <= floorBound {
			return
		}
	}
	t.Fatalf("a warmed backend faults %.1f pages per commit, a cold one %.1f (more than %.0f%%): the heap is given back between commits", warm, cold, bound*100)
}

// coldCommitFaults is commitFaults on a backend nothing warms.
func coldCommitFaults(t *testing.T) float64 {
	setup := backendSetup
	backendSetup = nil
	defer func() { backendSetup = setup }()
	return commitFaults(t, PGConfig{MaxConns: 1})
}

// commitFaults commits batches of 50 publishes over 20 rooms on a store of
// one connection and returns its backend's minor faults per commit.
func commitFaults(t *testing.T, cfg PGConfig) float64 {
	ctx := context.Background()
	st := openTestPG(t, newTestDB(t), cfg)
	defer st.Close()
	var pid int
	if err := st.pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"text":"` + strings.Repeat("x", 200) + `"}`)
	n := 0
	batch := func() {
		reqs := make([]*Row, 50)
		for i := range reqs {
			n++
			reqs[i] = &Row{Key: proto.RoomKey("a", "r"+strconv.Itoa(n%20)), From: "u", ID: []byte(strconv.Itoa(n)), Body: body}
		}
		res := make([]Stored, len(reqs))
		if err := commitInto(ctx, st, reqs, res); err != nil {
			t.Fatal(err)
		}
	}
	for range 20 {
		batch()
	}
	f0 := backendFaults(t, pid)
	const batches = 200
	for range batches {
		batch()
	}
	f1 := backendFaults(t, pid)
	return float64(f1-f0) / batches
}
