//go:build linux

package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/roost-chat/roost/pubsub/redistest"
)

// The full-size scripts run here in their --short form, so that what an
// operator runs at full size is what CI keeps working: each starts its own
// nodes (and Redis, and a database), runs, writes its report and plot, and
// cleans up. They need bash, PostgreSQL with psql, and redis-server; without
// them the test is skipped, or fails when CI=true. -short skips them.
func runScript(t *testing.T, name string, args ...string) (string, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("the scripts take 30-60 s each")
	}
	need := []string{"bash", "taskset", "curl"}
	if name == "capacity.sh" || name == "scaleout.sh" {
		need = append(need, "jq")
	}
	switch name {
	case "one-channel.sh":
	case "ab.sh": // PostgreSQL, no Redis; it builds from git
		need = append(need, "psql", "git")
	default:
		need = append(need, "psql", "redis-server")
		redistest.RequireBinaries(t)
	}
	for _, bin := range need {
		if _, err := exec.LookPath(bin); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s needs %s: %v", name, bin, err)
			}
			t.Skipf("%s needs %s: %v", name, bin, err)
		}
	}
	if name != "one-channel.sh" {
		if out, err := exec.Command("psql", pgAdminURL(), "-qtAc", "SELECT 1").CombinedOutput(); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s needs PostgreSQL at %s: %v\n%s", name, pgAdminURL(), err, out)
			}
			t.Skipf("%s needs PostgreSQL at %s: %v", name, pgAdminURL(), err)
		}
	}
	out := t.TempDir()
	cmd := exec.Command("bash", append([]string{filepath.Join("scripts", name)}, args...)...)
	cmd.Env = append(os.Environ(), "OUT="+out)
	done := make(chan struct{})
	var combined []byte
	var err error
	go func() {
		combined, err = cmd.CombinedOutput()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(4 * time.Minute):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("%s did not finish in 4 minutes:\n%s", name, combined)
	}
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, combined)
	}
	return out, string(combined)
}

func pgAdminURL() string {
	if u := os.Getenv("ROOST_TEST_DATABASE_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

func readReport(t *testing.T, path string) *Report {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if svg := strings.TrimSuffix(path, ".json") + ".svg"; !fileHas(svg, "<svg") {
		t.Errorf("no plot at %s", svg)
	}
	return &rep
}

// noDeadlocks checks the count the scripts add to a report from
// pg_stat_database: nodes sharing rooms commit without deadlocks.
func noDeadlocks(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		PGDeadlocks *int64 `json:"pg_deadlocks"`
	}
	if err := json.Unmarshal(b, &r); err != nil || r.PGDeadlocks == nil || *r.PGDeadlocks != 0 {
		t.Errorf("%s: pg_deadlocks %v (want 0): %v", path, r.PGDeadlocks, err)
	}
}

func fileHas(path, s string) bool {
	b, err := os.ReadFile(path)
	return err == nil && strings.Contains(string(b), s)
}

func TestScriptChat100kShort(t *testing.T) {
	out, log := runScript(t, "chat-100k.sh", "--short")
	rep := readReport(t, filepath.Join(out, "chat-100k.json"))
	r := rep.Levels[0]
	if rep.Connections != 2000 || rep.Verdict == nil || !rep.Verdict.OK || len(r.Nodes) != 2 || len(rep.Series) == 0 {
		t.Fatalf("report: %d connections verdict %+v nodes %+v\n%s", rep.Connections, rep.Verdict, r.Nodes, log)
	}
	if len(rep.Targets) != 3 || !rep.Targets[0].Met {
		t.Errorf("targets %+v", rep.Targets)
	}
	noDeadlocks(t, filepath.Join(out, "chat-100k.json"))
	if !strings.Contains(log, "SUMMARY chat-100k: 2000 connections") || !strings.Contains(log, "RESULTS chat-100k: "+filepath.Join(out, "chat-100k.json")) {
		t.Errorf("no summary line or results path:\n%s", log)
	}
}

func TestScriptOneChannelShort(t *testing.T) {
	out, log := runScript(t, "one-channel.sh", "--short")
	rep := readReport(t, filepath.Join(out, "one-channel.json"))
	if rep.Connections != 610 || rep.Verdict == nil || !rep.Verdict.OK || rep.Levels[0].DeliveryPct != 100 {
		t.Fatalf("100 msg/s run: %+v\n%s", rep.Levels, log)
	}
	step := readReport(t, filepath.Join(out, "one-channel-step.json"))
	if len(step.Levels) == 0 {
		t.Fatalf("step run without levels\n%s", log)
	}
}

// TestScriptOneChannelSteeredShort: --steer runs the same in a network
// namespace whose loopback steers received packets to the bench's CPUs,
// says so in its reports, and leaves the machine's loopback as it was.
func TestScriptOneChannelSteeredShort(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("--steer needs root (a network namespace and a sysfs mount in it)")
	}
	for _, bin := range []string{"unshare", "ip"} {
		if _, err := exec.LookPath(bin); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("one-channel.sh --steer needs %s: %v", bin, err)
			}
			t.Skipf("one-channel.sh --steer needs %s: %v", bin, err)
		}
	}
	const rps = "/sys/class/net/lo/queues/rx-0/rps_cpus"
	before, _ := os.ReadFile(rps)
	out, log := runScript(t, "one-channel.sh", "--short", "--steer")
	for _, name := range []string{"one-channel.json", "one-channel-step.json"} {
		b, err := os.ReadFile(filepath.Join(out, name))
		if err != nil || !strings.Contains(string(b), `"steered": true`) {
			t.Fatalf("%s does not say it was steered (%v)\n%s", name, err, log)
		}
	}
	rep := readReport(t, filepath.Join(out, "one-channel.json"))
	if rep.Connections != 610 || rep.Verdict == nil || !rep.Verdict.OK || rep.Levels[0].DeliveryPct != 100 {
		t.Fatalf("100 msg/s run, steered: %+v\n%s", rep.Levels, log)
	}
	if after, _ := os.ReadFile(rps); string(after) != string(before) {
		t.Fatalf("the machine's loopback steering changed: %q -> %q", before, after)
	}
}

func TestScriptStormShort(t *testing.T) {
	out, log := runScript(t, "storm.sh", "--short")
	storm := readReport(t, filepath.Join(out, "storm-storm.json"))
	others := readReport(t, filepath.Join(out, "storm-others.json"))
	r := storm.Levels[0]
	if storm.Verdict == nil || !storm.Verdict.OK || r.Rejoins != 1500 || r.Away != 0 || len(storm.Windows) != 1 || storm.Windows[0].Rejoined != 1500 {
		t.Fatalf("storm: verdict %+v rejoins %d away %d windows %+v\n%s", storm.Verdict, r.Rejoins, r.Away, storm.Windows, log)
	}
	if others.Verdict == nil || !others.Verdict.OK || len(others.Levels[0].Closes) != 0 {
		t.Fatalf("A's own members: %+v\n%s", others.Levels[0], log)
	}
	// the rejoins of a room share their catch-up reads: without that, one
	// store read per catch-up page
	b, err := os.ReadFile(filepath.Join(out, "storm-reads.txt"))
	var reads, pages int
	var per float64
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Sscanf(string(b), "A: %d store reads for %d catch-up pages: %f", &reads, &pages, &per); err != nil || pages < 500 || per > 0.5 {
		t.Fatalf("join reads: %q (%v)", b, err)
	}
}

func TestScriptSoakShort(t *testing.T) {
	out, log := runScript(t, "soak.sh", "--short")
	rep := readReport(t, filepath.Join(out, "soak.json"))
	r := rep.Levels[0]
	if rep.Verdict == nil || !rep.Verdict.OK || r.Rejoins < 2000 || len(rep.Windows) != 6 {
		t.Fatalf("soak: verdict %+v rejoins %d windows %d\n%s", rep.Verdict, r.Rejoins, len(rep.Windows), log)
	}
	if !strings.Contains(log, "soak verdict: ok") || !strings.Contains(log, "0 rooms with holes") || !strings.Contains(log, "SUMMARY soak: ") {
		t.Fatalf("script verdict missing:\n%s", log)
	}
	noDeadlocks(t, filepath.Join(out, "soak.json"))
}

func TestScriptSoakClusterShort(t *testing.T) {
	if _, err := exec.LookPath("redis-cli"); err != nil && os.Getenv("CI") != "true" {
		t.Skip("needs redis-cli")
	}
	out, log := runScript(t, "soak.sh", "--short", "--cluster")
	rep := readReport(t, filepath.Join(out, "soak.json"))
	// Eight fault windows, the last one the slot move's end, when it ends
	// inside the measured run; on a slow machine the move can take longer
	// than the short run, and its end then falls after the last window.
	if rep.Verdict == nil || !rep.Verdict.OK || len(rep.Windows) < 8 && !(len(rep.Windows) == 7 && strings.Contains(log, "event: slots moved")) || !strings.Contains(log, "soak verdict: ok") {
		t.Fatalf("soak --cluster: verdict %+v windows %d\n%s", rep.Verdict, len(rep.Windows), log)
	}
}

// TestScriptABShort: ab.sh builds both sides from git (the same revision
// here, built once), runs one pair of tiny loads and prints the before/after
// table: the four figures, a number on each side, the medians, the change
// and its verdict, then the load of every run.
func TestScriptABShort(t *testing.T) {
	out, log := runScript(t, "ab.sh", "HEAD", "HEAD", "--short")
	b, err := os.ReadFile(filepath.Join(out, "ab.md"))
	if err != nil {
		t.Fatalf("no table: %v\n%s", err, log)
	}
	if !strings.Contains(log, string(b)) {
		t.Errorf("the table in ab.md is not what the script printed:\n%s", log)
	}
	var rows [][]string
	var loads int
	section := 0
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "|") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		switch {
		case cells[0] == "figure":
			section++
		case strings.HasPrefix(cells[0], "---"):
		case section == 1:
			rows = append(rows, cells)
		case section == 2:
			loads++
			var l0, l1, l2, l3 float64
			if n, err := fmt.Sscanf(cells[1], "%f -> %f / %f -> %f", &l0, &l1, &l2, &l3); n != 4 {
				t.Errorf("load cell %q: %v", cells[1], err)
			}
		}
	}
	want := []string{"node µs per delivered frame, room of 33, 100 msg/s", "node µs per delivered frame, room of 33, 400 msg/s",
		"node RSS bytes per idle joined connection (300 in 10 rooms)", "PostgreSQL µs per publish, 200/s over 20 rooms"}
	if len(rows) != len(want) || loads != len(want) {
		t.Fatalf("%d figure rows and %d load rows, want %d each:\n%s", len(rows), loads, len(want), b)
	}
	for i, r := range rows {
		// figure | pair 1 before / after | median before | median after | change | within 3 % or better
		if len(r) != 6 || r[0] != want[i] {
			t.Errorf("row %d: %q", i, r)
			continue
		}
		var before, after, mb, ma, change float64
		if n, err := fmt.Sscanf(strings.ReplaceAll(r[1], "*", ""), "%f / %f", &before, &after); n != 2 || before <= 0 || after <= 0 {
			t.Errorf("%s: pair cell %q (%v)", r[0], r[1], err)
		}
		if _, err := fmt.Sscanf(r[2], "%f", &mb); err != nil || mb <= 0 {
			t.Errorf("%s: median before %q", r[0], r[2])
		}
		if _, err := fmt.Sscanf(r[3], "%f", &ma); err != nil || ma <= 0 {
			t.Errorf("%s: median after %q", r[0], r[3])
		}
		if _, err := fmt.Sscanf(r[4], "%f %%", &change); err != nil {
			t.Errorf("%s: change %q", r[0], r[4])
		}
		if ok := change <= 3; r[5] != map[bool]string{true: "yes", false: "NO"}[ok] {
			t.Errorf("%s: change %v%% says %q", r[0], change, r[5])
		}
	}
	tsv, err := os.ReadFile(filepath.Join(out, "ab.tsv"))
	if err != nil || strings.Count(string(tsv), "\n") != 1+2*len(want) {
		t.Errorf("ab.tsv: want a header and %d runs (%v):\n%s", 2*len(want), err, tsv)
	}
}

// TestScriptNodeShareShort: one node on CPU 1 with 2,000 connections
// through Redis and PostgreSQL, the bench on CPU 0; the targets are
// reported (only delivery is held to on a shared CI machine).
func TestScriptNodeShareShort(t *testing.T) {
	out, log := runScript(t, "node-share.sh", "--short")
	rep := readReport(t, filepath.Join(out, "node-share.json"))
	r := rep.Levels[0]
	if rep.Connections != 2000 || rep.Verdict == nil || !rep.Verdict.OK || r.DeliveryPct != 100 || len(r.Nodes) != 1 || len(r.Watched) != 1 {
		t.Fatalf("report: %d connections verdict %+v level %+v\n%s", rep.Connections, rep.Verdict, r, log)
	}
	if len(rep.Targets) != 3 || !rep.Targets[0].Met || rep.Targets[2].Unit != "MiB" {
		t.Errorf("targets %+v", rep.Targets)
	}
	if !strings.Contains(log, "SUMMARY node-share: 2000 connections") || !strings.Contains(log, "RESULTS node-share: ") {
		t.Errorf("no summary line or results path:\n%s", log)
	}
}

// TestScriptCapacityShort: the steady load, a burst on top, every publish
// acked and delivered, the backlog's end and the latencies around it.
func TestScriptCapacityShort(t *testing.T) {
	out, log := runScript(t, "capacity.sh", "--short")
	rep := readReport(t, filepath.Join(out, "capacity.json"))
	b := rep.Burst
	if rep.Verdict == nil || !rep.Verdict.OK || b == nil || b.Offered != 5000 || b.Sent != 5000 || b.Acked != 5000 || b.BacklogGoneS <= 0 {
		t.Fatalf("verdict %+v burst %+v\n%s", rep.Verdict, b, log)
	}
	if b.Before == nil || b.Before.Acked == 0 || b.During == nil || b.During.Acked == 0 {
		t.Fatalf("windows before %+v during %+v", b.Before, b.During)
	}
	noDeadlocks(t, filepath.Join(out, "capacity.json"))
	if !strings.Contains(log, "BURST capacity: ") || !strings.Contains(log, "backlog gone") || !strings.Contains(log, "SUMMARY capacity: 600 connections") {
		t.Errorf("no burst or summary line:\n%s", log)
	}
}

// TestScriptScaleoutShort: 1 and 2 nodes, each in a cgroup of its own with
// the quota, a step run each; the cgroups are gone afterwards.
func TestScriptScaleoutShort(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("scaleout.sh needs root (a cgroup per node)")
	}
	out, log := runScript(t, "scaleout.sh", "--short")
	b, err := os.ReadFile(filepath.Join(out, "scaleout.json"))
	if err != nil {
		t.Fatalf("%v\n%s", err, log)
	}
	var s struct {
		Quota  int `json:"quota_pct"`
		Counts []struct {
			Nodes      int     `json:"nodes"`
			Highest    float64 `json:"highest_sustained_per_s"`
			PerVCPU    float64 `json:"frames_per_s_per_vcpu"`
			UsPerFrame float64 `json:"node_us_per_frame"`
		} `json:"counts"`
	}
	if err := json.Unmarshal(b, &s); err != nil || s.Quota != 25 || len(s.Counts) != 2 {
		t.Fatalf("scaleout.json %s: %v\n%s", b, err, log)
	}
	for i, c := range s.Counts {
		if c.Nodes != i+1 || c.Highest < 200 || c.PerVCPU <= 0 || c.UsPerFrame <= 0 {
			t.Errorf("count %d: %+v", i, c)
		}
		rep := readReport(t, filepath.Join(out, fmt.Sprintf("scaleout-%d.json", i+1)))
		if len(rep.Levels) == 0 || len(rep.Levels[0].Nodes) != i+1 {
			t.Errorf("%d node(s): levels %d", i+1, len(rep.Levels))
		}
	}
	if !strings.Contains(log, "SCALEOUT 2 node(s) at 25% each") || !strings.Contains(log, "SUMMARY scaleout: ") {
		t.Errorf("no scaleout lines:\n%s", log)
	}
	if m, _ := filepath.Glob("/sys/fs/cgroup/cpu/roost-scaleout-*"); len(m) > 0 {
		t.Errorf("cgroups left behind: %v", m)
	}
}

// TestScriptAckSplitShort: the ack's time split is read from both nodes
// over the window: one observation per phase for each acked publish, and
// the scheduler's line.
func TestScriptAckSplitShort(t *testing.T) {
	out, log := runScript(t, "acksplit.sh", "--short")
	rep := readReport(t, filepath.Join(out, "acksplit.json"))
	r := rep.Levels[0]
	if r.Acked == 0 || r.Acked != r.Sent {
		t.Fatalf("acked %d of %d\n%s", r.Acked, r.Sent, log)
	}
	b, err := os.ReadFile(filepath.Join(out, "acksplit-split.txt"))
	if err != nil {
		t.Fatal(err)
	}
	phases := map[string]int{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 6 && f[0] != "phase" {
			var n int
			if _, err := fmt.Sscan(f[1], &n); err == nil {
				phases[f[0]] = n
			}
		}
	}
	for _, ph := range []string{"queue", "pipeline", "window", "commit", "answer", "broker", "inbox", "write", "read-to-queued"} {
		// The window's publishes, give or take those answered across its
		// edges (the warmup's, the drain's).
		if n := phases[ph]; n < int(r.Acked)*9/10 {
			t.Errorf("phase %s: %d observations over the window, want about the %d acked", ph, n, r.Acked)
		}
	}
	if !strings.Contains(string(b), "scheduler over ") {
		t.Errorf("no scheduler line")
	}
	if t.Failed() {
		t.Fatalf("split:\n%s\n%s", b, log)
	}
}
