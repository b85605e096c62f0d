package proto

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"testing"
)

// sigOf is the signature computed the plain way, as a backend would.
func sigOf(secret string, ts int64, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(strconv.FormatInt(ts, 10) + "." + string(body)))
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// A Signer reused across calls and rotations gives what a fresh
// computation gives: its kept states never leak from one secret or one
// call into another.
func TestSignerMatchesPlainHMAC(t *testing.T) {
	var s Signer
	body := []byte(`{"type":"publish","app":"chat"}`)
	steps := [][]string{
		{"secret-a-0123456789"},
		{"secret-a-0123456789"},
		{"secret-b-0123456789", "secret-a-0123456789"}, // rotation
		{"secret-b-0123456789", "secret-a-0123456789"},
		{"secret-b-0123456789"}, // previous expired
		{"secret-c-0123456789", "secret-b-0123456789"},
		{"", "secret-c-0123456789"},
		{"secret-d-0123456789", "secret-e-0123456789"},
		{"secret-f-0123456789", "secret-g-0123456789"},
		{"secret-c-0123456789", "secret-c-0123456789"},
		{"secret-b-0123456789", "secret-a-0123456789"},
	}
	var buf []byte
	for i, secrets := range steps {
		ts := int64(1700000000 + i)
		var want []string
		for _, sec := range secrets {
			if sec != "" {
				want = append(want, sigOf(sec, ts, body))
			}
		}
		buf = s.Append(buf[:0], secrets, ts, body)
		if got := string(buf); got != strings.Join(want, ",") {
			t.Fatalf("step %d %v: got %s, want %s", i, secrets, got, strings.Join(want, ","))
		}
		if got := SignBody(secrets, ts, body); got != strings.Join(want, ",") {
			t.Fatalf("step %d: SignBody %s, want %s", i, got, strings.Join(want, ","))
		}
	}
	if len(s.keys) > maxSignerKeys {
		t.Fatalf("signer keeps %d states", len(s.keys))
	}
}

// The same secrets again cost no allocation (the proxy calls' steady state).
func TestSignerSteadyAllocs(t *testing.T) {
	var s Signer
	secrets := []string{"secret-b-0123456789", "secret-a-0123456789"}
	body := make([]byte, 300)
	buf := s.Append(nil, secrets, 1700000000, body)
	if n := testing.AllocsPerRun(100, func() { buf = s.Append(buf[:0], secrets, 1700000000, body) }); n != 0 {
		t.Fatalf("%v allocs per signature", n)
	}
}

// BenchmarkSign: one signature of a 300-byte proxy call body, kept states
// (Signer) against a fresh HMAC per call (SignBody, the webhook's way).
func BenchmarkSign(b *testing.B) {
	body := make([]byte, 300)
	for _, n := range []int{1, 2} {
		secrets := []string{"secret-b-0123456789", "secret-a-0123456789"}[:n]
		b.Run("signer/secrets="+strconv.Itoa(n), func(b *testing.B) {
			var s Signer
			var buf []byte
			b.ReportAllocs()
			for b.Loop() {
				buf = s.Append(buf[:0], secrets, 1700000000, body)
			}
		})
		b.Run("fresh/secrets="+strconv.Itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = SignBody(secrets, 1700000000, body)
			}
		})
	}
}
