//go:build linux

package bench

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
)

// The node's own split of an ack's time over a window of the reads bench:
// roost_ack_phase_seconds{phase} (docs/operations.md, "Where an ack
// waits"), the difference of the scrapes at the window's edges; and in
// the window of unread requests, theirs: roost_unread_phase_seconds{phase}.

// ackPhaseOrder is the order a publish passes the phases: fanout's
// ackPhaseNames, written again because the bench is a client of the node
// and may import only proto and pubsub (TestLayering); TestReads checks
// the split line against a real node.
var ackPhaseOrder = []string{"queue", "pipeline", "window", "commit", "answer", "broker", "inbox", "write"}

// unreadPhaseOrder is the order an unread request passes its phases:
// fanout's queryPhaseNames, written again for the same reason.
var unreadPhaseOrder = []string{"positions", "queue", "store", "answer", "inbox"}

// ackPhaseStat is one phase's observations in a window.
type ackPhaseStat struct {
	phase string
	count uint64
	mean  float64 // seconds
	// p99 in seconds, interpolated within its bucket; p99Above: past the
	// last finite bucket, p99 is that bucket's bound, a lower bound
	p99      float64
	p99Above bool
	p99OK    bool // buckets were there to derive it
}

// parseMetrics reads the Prometheus text format: each series, as written
// (its name and labels), and its value; comments and timestamps left out.
func parseMetrics(r io.Reader) (map[string]float64, error) {
	m := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		// label values here hold no spaces: the series ends at the last
		// '}' or, without labels, at the first space
		end := strings.LastIndexByte(line, '}') + 1
		if end == 0 {
			end = strings.IndexByte(line, ' ')
		}
		if end <= 0 {
			continue
		}
		f := strings.Fields(line[end:])
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics: %q: %w", line, err)
		}
		m[line[:end]] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	return m, nil
}

// seriesLabels splits a series into its name and labels.
func seriesLabels(series string) (string, map[string]string) {
	i := strings.IndexByte(series, '{')
	if i < 0 {
		return series, nil
	}
	labels := map[string]string{}
	rest := strings.TrimSuffix(series[i+1:], "}")
	for rest != "" {
		k, after, ok := strings.Cut(rest, `="`)
		if !ok {
			break
		}
		v, after, ok := strings.Cut(after, `"`)
		if !ok {
			break
		}
		labels[strings.TrimSpace(k)] = v
		rest = strings.TrimPrefix(after, ",")
	}
	return series[:i], labels
}

// ackSplit is each ack phase's count, mean and p99 between two scrapes of
// a node's metrics, in the order a publish passes the phases.
func ackSplit(before, after map[string]float64) ([]ackPhaseStat, error) {
	return phaseSplit("roost_ack_phase_seconds", ackPhaseOrder, before, after)
}

// unreadSplit is ackSplit for unread requests.
func unreadSplit(before, after map[string]float64) ([]ackPhaseStat, error) {
	return phaseSplit("roost_unread_phase_seconds", unreadPhaseOrder, before, after)
}

// phaseSplit is each phase's count, mean and p99 of the histogram family
// name between two scrapes of a node's metrics, in order. The node writes
// the histogram with cumulative `le` buckets (fanout/hist).
func phaseSplit(name string, order []string, before, after map[string]float64) ([]ackPhaseStat, error) {
	buckets := map[string][]histBucket{}
	for series, v := range after {
		n, labels := seriesLabels(series)
		le, ok := labels["le"]
		if n != name+"_bucket" || !ok {
			continue
		}
		upper, err := strconv.ParseFloat(le, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", series, err)
		}
		ph := labels["phase"]
		buckets[ph] = append(buckets[ph], histBucket{upper, v - before[series]})
	}
	var out []ackPhaseStat
	for _, ph := range order {
		key := `{phase="` + ph + `"}`
		cnt, ok := after[name+"_count"+key]
		if !ok {
			continue
		}
		st := ackPhaseStat{phase: ph}
		n := cnt - before[name+"_count"+key]
		if n > 0 {
			st.count = uint64(n)
			st.mean = (after[name+"_sum"+key] - before[name+"_sum"+key]) / n
		}
		bs := buckets[ph]
		sort.Slice(bs, func(i, j int) bool { return bs[i].upper < bs[j].upper })
		if len(bs) > 0 && n > 0 {
			st.p99, st.p99Above = bucketQuantile(0.99, n, bs)
			st.p99OK = true
		}
		out = append(out, st)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("the node has no %s", name)
	}
	return out, nil
}

// histBucket is one bucket of a histogram: its upper bound and its count,
// cumulative.
type histBucket struct{ upper, n float64 }

// bucketQuantile is the q-quantile of cumulative buckets in order,
// interpolated linearly within its bucket (the first from 0). Past the
// last finite bound it answers that bound, and above. total is the
// observations' count; the buckets' own when it lags them (a scrape reads
// them one by one while observations continue).
func bucketQuantile(q, total float64, bs []histBucket) (float64, bool) {
	want := q * math.Max(total, bs[len(bs)-1].n)
	lo, loN := 0.0, 0.0
	for _, b := range bs {
		upper, n := b.upper, b.n
		if n >= want {
			if math.IsInf(upper, 1) {
				return lo, true
			}
			if n == loN {
				return upper, false
			}
			return lo + (upper-lo)*(want-loN)/(n-loN), false
		}
		if !math.IsInf(upper, 1) {
			lo = upper
		}
		loN = n
	}
	return lo, true
}

// fmtAckSplit is the split in one line: each phase's mean and p99 in ms.
func fmtAckSplit(split []ackPhaseStat) string { return fmtSplit(split, "acks") }

// fmtSplit is a split in one line, counted in what (the most any phase
// observed).
func fmtSplit(split []ackPhaseStat, what string) string {
	var b strings.Builder
	var n uint64
	for i, st := range split {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s %.2f/", st.phase, st.mean*1e3)
		switch {
		case !st.p99OK:
			b.WriteString("-")
		case st.p99Above:
			fmt.Fprintf(&b, ">%.0f", st.p99*1e3)
		default:
			fmt.Fprintf(&b, "%.2f", st.p99*1e3)
		}
		n = max(n, st.count)
	}
	fmt.Fprintf(&b, " (%d %s)", n, what)
	return b.String()
}
