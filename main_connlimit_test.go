package main

import (
	"testing"

	"github.com/roost-chat/roost/pubsub"
)

// TestShedShare: the excess over an app's limit is divided over the nodes
// in proportion to what they held before closing any; every node computes
// the same division, in whatever order they act, and the cluster ends at
// the limit exactly.
func TestShedShare(t *testing.T) {
	type nodes = map[string]pubsub.ConnCount
	cases := []struct {
		name  string
		limit int64
		n     nodes
		want  map[string]int64
		over  bool
	}{
		{"within", 100, nodes{"a": {Conns: 60}, "b": {Conns: 40}}, map[string]int64{"a": 0, "b": 0}, false},
		{"no limit", 0, nodes{"a": {Conns: 600}}, map[string]int64{"a": 0}, false},
		{"even", 100, nodes{"a": {Conns: 80}, "b": {Conns: 80}}, map[string]int64{"a": 30, "b": 30}, true},
		{"remainder to the larger fraction", 100, nodes{"a": {Conns: 80}, "b": {Conns: 70}}, map[string]int64{"a": 27, "b": 23}, true},
		{"ties by name", 100, nodes{"a": {Conns: 67}, "b": {Conns: 67}, "c": {Conns: 67}}, map[string]int64{"a": 34, "b": 34, "c": 33}, true},
		// a closed its share first: b's is unchanged, a closes no more.
		{"after one closed", 100, nodes{"a": {Conns: 50, Shed: 30}, "b": {Conns: 80}}, map[string]int64{"a": 0, "b": 30}, true},
		// a closed part of its share (its loops were late): the rest.
		{"part closed", 100, nodes{"a": {Conns: 70, Shed: 10}, "b": {Conns: 50, Shed: 30}}, map[string]int64{"a": 20, "b": 0}, true},
		// b's clients left meanwhile: nobody closes more than the excess.
		{"capped by the excess", 100, nodes{"a": {Conns: 80}, "b": {Conns: 25, Shed: 30}}, map[string]int64{"a": 5, "b": 0}, true},
		{"a node without the app", 10, nodes{"a": {Conns: 12}}, map[string]int64{"a": 2}, true},
	}
	for _, c := range cases {
		var total int64
		for name := range c.n {
			k, over := shedShare(c.limit, name, c.n)
			if k != c.want[name] || over != c.over {
				t.Errorf("%s: %s closes %d (over %v), want %d (%v)", c.name, name, k, over, c.want[name], c.over)
			}
			total += k
		}
		var conns int64
		for _, n := range c.n {
			conns += n.Conns
		}
		if c.over && conns-total != c.limit {
			t.Errorf("%s: the cluster ends at %d, want the limit %d", c.name, conns-total, c.limit)
		}
	}
}
