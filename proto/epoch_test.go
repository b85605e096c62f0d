package proto

import (
	"strings"
	"testing"
)

// A join may carry the epoch its client last saw: a string of at most
// MaxEpoch bytes, escapes decoded; anything else is a bad request.
func TestDecodeEpoch(t *testing.T) {
	for _, c := range []struct {
		in    string
		err   error
		epoch string
		has   bool
	}{
		{`{"op":"join","room":"r","since":3,"epoch":"abc.1"}`, nil, "abc.1", true},
		{`{"op":"join","room":"r","epoch":""}`, nil, "", true},
		{`{"op":"join","room":"r","epoch":"a\u0062"}`, nil, "ab", true},
		{`{"op":"join","room":"r","epoch":"` + strings.Repeat("e", MaxEpoch) + `"}`, nil, strings.Repeat("e", MaxEpoch), true},
		{`{"op":"join","room":"r"}`, nil, "", false},
		{`{"op":"join","room":"r","epoch":"` + strings.Repeat("e", MaxEpoch+1) + `"}`, ErrBadEpoch, "", false},
		{`{"op":"join","room":"r","epoch":"` + strings.Repeat(`\u0065`, MaxEpoch+1) + `"}`, ErrBadEpoch, "", false},
		{`{"op":"join","room":"r","epoch":7}`, ErrBadEpoch, "", false},
	} {
		var cmd Command
		err := Decode([]byte(c.in), &cmd)
		if err != c.err || cmd.HasEpoch != c.has || string(cmd.Epoch) != c.epoch {
			t.Errorf("%s: err %v epoch %q has %v; want %v %q %v", c.in, err, cmd.Epoch, cmd.HasEpoch, c.err, c.epoch, c.has)
		}
	}
	var cmd Command
	in := []byte(`{"op":"join","room":"r","since":3,"epoch":"a\u0062c"}`)
	if n := testing.AllocsPerRun(100, func() { _ = Decode(in, &cmd) }); n != 0 {
		t.Fatalf("Decode with epoch allocates %v", n)
	}
}
