package proto

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"hash"
	"strconv"
)

// The node signs what it sends an app's backend (webhook POSTs, proxy
// calls; docs/protocol.md, Webhooks): X-Roost-Timestamp is the Unix time
// in seconds, and X-Roost-Signature is sha256=HEX of HMAC-SHA256 over
// "TIMESTAMP.BODY" with each of the app's current secrets (App.Secrets),
// comma-separated, so that a backend knowing either secret of a rotation
// verifies every call made during it.

// SignBody is the X-Roost-Signature value of body sent at ts (Unix
// seconds). A caller signing often keeps a Signer instead.
func SignBody(secrets []string, ts int64, body []byte) string {
	var s Signer
	return string(s.Append(nil, secrets, ts, body))
}

// Signer computes signatures as SignBody does, keeping each secret's
// keyed HMAC state from one call to the next: with the same secrets
// (every call but those across a rotation) a signature costs no
// allocation and no rehashing of the key. One goroutine at a time.
type Signer struct {
	keys []string
	macs []hash.Hash
	ts   []byte
	sum  [sha256.Size]byte
}

// Append appends the X-Roost-Signature value of body sent at ts to dst.
// Empty secrets are skipped.
func (s *Signer) Append(dst []byte, secrets []string, ts int64, body []byte) []byte {
	s.ts = strconv.AppendInt(s.ts[:0], ts, 10)
	s.ts = append(s.ts, '.')
	n := 0
	for _, sec := range secrets {
		if sec == "" {
			continue
		}
		m := s.mac(n, sec)
		n++
		m.Write(s.ts)
		m.Write(body)
		if n > 1 {
			dst = append(dst, ',')
		}
		dst = append(dst, "sha256="...)
		dst = hex.AppendEncode(dst, m.Sum(s.sum[:0]))
	}
	return dst
}

// mac is the reset HMAC state of secret, the i-th of this call. The
// states are kept in the order of the secrets (slots below i are this
// call's already), so that the next call with the same secrets finds each
// at once; a rotation's new secret takes a fresh slot while the old one
// stays for its turn as the previous secret.
func (s *Signer) mac(i int, secret string) hash.Hash {
	for j := i; j < len(s.keys); j++ {
		if s.keys[j] == secret {
			s.keys[i], s.keys[j] = s.keys[j], s.keys[i]
			s.macs[i], s.macs[j] = s.macs[j], s.macs[i]
			m := s.macs[i]
			m.Reset()
			return m
		}
	}
	m := hmac.New(sha256.New, []byte(secret))
	if len(s.keys) < maxSignerKeys {
		s.keys, s.macs = append(s.keys, secret), append(s.macs, m)
		j := len(s.keys) - 1
		s.keys[i], s.keys[j] = s.keys[j], s.keys[i]
		s.macs[i], s.macs[j] = s.macs[j], s.macs[i]
	} else {
		s.keys[i], s.macs[i] = secret, m
	}
	return m
}

// maxSignerKeys bounds the states a Signer keeps: two secrets at a time,
// and room for those of a rotation under way.
const maxSignerKeys = 4
