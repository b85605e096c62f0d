package pubsub

import (
	"bytes"
	"encoding/binary"
	"log/slog"
	"strings"
	"testing"

	"github.com/redis/rueidis"
)

// FuzzParseRedisURL: any input either parses into a usable config or fails
// with an error that does not leak the password.
func FuzzParseRedisURL(f *testing.F) {
	f.Fuzz(func(t *testing.T, s string) {
		cfg, err := ParseRedisURL(s)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "cannot parse redis url") {
				t.Fatalf("error %q does not follow the cannot-parse form", err)
			}
			if cfg.Password != "" && len(cfg.Password) > 3 && strings.Contains(err.Error(), cfg.Password) {
				t.Fatalf("error %q leaks the password", err)
			}
			return
		}
		if len(cfg.Addrs) == 0 || cfg.validate() != nil {
			t.Fatalf("ParseRedisURL(%q) = %+v: accepted an unusable config", s, cfg)
		}
		if cfg.Cluster != (len(cfg.Addrs) > 1) {
			t.Fatalf("ParseRedisURL(%q): Cluster=%v with %d addresses", s, cfg.Cluster, len(cfg.Addrs))
		}
	})
}

// FuzzOnMessage: whatever arrives on a channel, the decoder never panics,
// and what it delivers is exactly the channel's key, the seq and the rest
// of the payload.
func FuzzOnMessage(f *testing.F) {
	f.Fuzz(func(t *testing.T, channel string, msg []byte) {
		rec := newRecorder()
		r := &Redis{h: rec, log: slog.New(slog.DiscardHandler), chanPrefix: "roost.{"}
		r.onMessage(rueidis.PubSubMessage{Channel: channel, Message: string(msg)})
		key, ok := strings.CutPrefix(channel, "roost.{")
		ok = ok && strings.HasSuffix(key, "}") && len(msg) >= 8
		if !ok {
			if len(rec.got) != 0 || r.malformed.Load() != 1 {
				t.Fatalf("malformed message delivered: %+v", rec.got)
			}
			return
		}
		key = key[:len(key)-1]
		got := rec.deliveries(key)
		if len(got) != 1 || got[0].seq != binary.BigEndian.Uint64(msg) || !bytes.Equal(got[0].frame, msg[8:]) {
			t.Fatalf("channel %q msg %x: delivered %+v", channel, msg, rec.got)
		}
	})
}
