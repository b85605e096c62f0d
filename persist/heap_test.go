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
func TestPostgresCommitKeepsBackendHeap(t *testing.T) {
	warm := commitFaults(t, PGConfig{MaxConns: 1})
	cold := commitFaults(t, PGConfig{MaxConns: 1, coldBackends: true})
	t.Logf("minor faults per commit of 50 publishes: warm %.1f, cold %.1f", warm, cold)
	if warm > cold/2 {
		t.Fatalf("a warmed backend faults %.1f pages per commit, a cold one %.1f: the heap is given back between commits", warm, cold)
	}
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
		reqs := make([]*proto.PubRequest, 50)
		for i := range reqs {
			n++
			reqs[i] = &proto.PubRequest{Key: proto.RoomKey("a", "r"+strconv.Itoa(n%20)), From: "u", ID: []byte(strconv.Itoa(n)), Body: body}
		}
		res := make([]proto.PubResult, len(reqs))
		if err := st.CommitBatch(ctx, reqs, res); err != nil {
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
