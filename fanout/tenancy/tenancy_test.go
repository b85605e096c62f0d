package tenancy

import (
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/roost-chat/roost/proto"
)

// The bucket is exact: with burst 3 at 10/s, three events at once pass,
// the fourth waits 100 ms, to the nanosecond.
func TestBucketExact(t *testing.T) {
	var b Bucket
	r := NewRate(10, 3)
	for i := range 3 {
		if w := b.Take(0, r); w != 0 {
			t.Fatalf("event %d waits %d", i, w)
		}
	}
	if w := b.Take(0, r); w != int64(100*time.Millisecond) {
		t.Fatalf("fourth waits %d", w)
	}
	if w := b.Take(int64(100*time.Millisecond)-1, r); w != 1 {
		t.Fatalf("1 ns early waits %d", w)
	}
	if w := b.Take(int64(100*time.Millisecond), r); w != 0 {
		t.Fatalf("on time waits %d", w)
	}
	if !b.Full(int64(time.Second)) || b.Full(0) {
		t.Fatal("Full")
	}
	if w := b.Take(0, Rate{}); w != 0 || !(Rate{}).Unlimited() || !NewRate(0, 5).Unlimited() {
		t.Fatal("the zero Rate limits")
	}
}

// TakeN spends n at once or nothing: with burst 5 at 10/s, 1 then 4 pass,
// 2 more wait 200 ms and spend nothing, 6 never fit.
func TestBucketTakeN(t *testing.T) {
	var b Bucket
	r := NewRate(10, 5)
	if w := b.Take(0, r); w != 0 {
		t.Fatal(w)
	}
	if w := b.TakeN(0, r, 4); w != 0 {
		t.Fatalf("4 more of burst 5 wait %d", w)
	}
	if w := b.TakeN(0, r, 2); w != int64(200*time.Millisecond) {
		t.Fatalf("2 over the burst wait %d", w)
	}
	if w := b.TakeN(int64(200*time.Millisecond), r, 2); w != 0 {
		t.Fatalf("2 after 200 ms wait %d (a refused TakeN spent something)", w)
	}
	if !r.Fits(5) || r.Fits(6) || !(Rate{}).Fits(1<<40) {
		t.Fatal("Fits")
	}
	if w := b.TakeN(0, Rate{}, 1000); w != 0 {
		t.Fatal("the zero Rate limits")
	}
}

func TestBucketTakeAllocatesNothing(t *testing.T) {
	var b Bucket
	r := NewRate(1e9, 1<<40)
	if n := testing.AllocsPerRun(1000, func() { b.Take(Now(), r) }); n != 0 {
		t.Fatalf("%v allocs per Take", n)
	}
}

// A rotation's previous secret matches until PrevUntil, without a new
// view; a view resolves the app's overrides over the node's defaults.
func TestViewSecretsAndLimits(t *testing.T) {
	now := time.Now()
	ttl := proto.Duration(time.Hour)
	five := int64(5)
	v := Resolve(DefaultLimits(), &proto.App{ID: "a", Secret: "new-secret-0123456789", PreviousSecret: "old-secret-0123456789",
		PreviousUntil: now.Add(time.Minute), Limits: proto.AppLimits{MaxConns: &five, MaxTokenTTL: &ttl},
		Identity: &proto.Identity{UserClaim: "sub", Issuer: "i"}})
	if !v.SecretMatches([]byte("old-secret-0123456789"), now) || !v.SecretMatches([]byte("new-secret-0123456789"), now) {
		t.Fatal("a valid secret does not match")
	}
	if v.SecretMatches([]byte("old-secret-0123456789"), now.Add(time.Minute)) || v.SecretMatches([]byte("new-secret"), now) {
		t.Fatal("an expired or wrong secret matches")
	}
	if v.MaxConns != 5 || v.MaxUserConns != 100 || v.MaxTokenTTL != time.Hour || v.UserClaim != "" || v.Issuer != "i" || v.UserRate.Unlimited() {
		t.Fatalf("view %+v", v)
	}
}

// Both limiters, as an edge spends them: one event per call, refused
// (and the refusal undone, as the server API did) when over. The figures
// and the choice they made are in Bucket's comment.
func BenchmarkLimiter(b *testing.B) {
	const perSec, burst = 1e12, 1 << 40 // never refuses: the cost of the common path
	b.Run("gcra", func(b *testing.B) {
		b.ReportAllocs()
		var bk Bucket
		r := NewRate(perSec, burst)
		for b.Loop() {
			if bk.Take(Now(), r) != 0 {
				b.Fatal("refused")
			}
		}
	})
	b.Run("xrate", func(b *testing.B) {
		b.ReportAllocs()
		l := rate.NewLimiter(rate.Limit(perSec), burst)
		for b.Loop() {
			now := time.Now()
			res := l.ReserveN(now, 1)
			if d := res.DelayFrom(now); !res.OK() || d > 0 {
				res.CancelAt(now)
				b.Fatal("refused")
			}
		}
	})
	b.Run("gcra-par", func(b *testing.B) {
		b.ReportAllocs()
		var bk Bucket
		r := NewRate(perSec, burst)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				bk.Take(Now(), r)
			}
		})
	})
	b.Run("xrate-par", func(b *testing.B) {
		b.ReportAllocs()
		l := rate.NewLimiter(rate.Limit(perSec), burst)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				now := time.Now()
				res := l.ReserveN(now, 1)
				if d := res.DelayFrom(now); !res.OK() || d > 0 {
					res.CancelAt(now)
				}
			}
		})
	})
}

// A snapshot holds the registry's apps and the static ones it does not
// hold, in id order, each resolved once against the node's defaults: the
// registry's entry wins over a static secret of the same id.
func TestSnapshotMergesStaticAndRegistry(t *testing.T) {
	max := int64(7)
	lim := DefaultLimits()
	snap := NewSnapshot(lim, map[string][]byte{"b": []byte("static-b"), "c": []byte("static-c")},
		[]proto.App{{ID: "c", Secret: "reg-c", Limits: proto.AppLimits{MaxConns: &max}}, {ID: "a", Secret: "reg-a", Disabled: true}})
	var ids []string
	for _, e := range snap.Entries {
		ids = append(ids, e.App.ID)
		if e.View.ID != e.App.ID {
			t.Errorf("entry %s has the view of %s", e.App.ID, e.View.ID)
		}
	}
	if len(ids) != 3 || ids[0] != "a" || ids[1] != "b" || ids[2] != "c" {
		t.Fatalf("entries %v, want [a b c]", ids)
	}
	a, b, c := snap.Entries[0].View, snap.Entries[1].View, snap.Entries[2].View
	if !a.Disabled || string(a.Secrets[0]) != "reg-a" {
		t.Errorf("a: disabled %v secrets %q", a.Disabled, a.Secrets)
	}
	if string(b.Secrets[0]) != "static-b" || b.MaxConns != lim.MaxConns {
		t.Errorf("b: secrets %q max conns %d", b.Secrets, b.MaxConns)
	}
	if len(c.Secrets) != 1 || string(c.Secrets[0]) != "reg-c" || c.MaxConns != 7 {
		t.Errorf("c: secrets %q max conns %d, want the registry's", c.Secrets, c.MaxConns)
	}
}
