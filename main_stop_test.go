package main

import (
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/roost-chat/roost/test/harness"
)

// The stop list stops last first, each once.
func TestStopListReverseOnce(t *testing.T) {
	var got []string
	s := &stopList{log: slog.New(slog.DiscardHandler)}
	for _, name := range []string{"a", "b", "c"} {
		s.add(name, func() { got = append(got, name) })
	}
	s.run()
	s.run()
	if want := []string{"c", "b", "a"}; !slices.Equal(got, want) {
		t.Fatalf("stopped %v, want %v", got, want)
	}
}

// A part that fails to start releases everything started before it,
// through the one stop list, in reverse: here the server API's address is
// taken, after the store, the publish path, the loops and the admin
// listener have started. serve exits 1, and the admin listener it had
// opened is closed again.
func TestFailedStartStopsWhatStarted(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	logs := &harness.SyncBuffer{}
	code := serve([]string{"--insecure", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--api", taken.Addr().String(),
		"--log-format", "json", "--loops", "2"}, io.Discard, logs, nil)
	if code != 1 {
		t.Fatalf("serve exited %d, want 1\n%s", code, logs)
	}
	var msgs []string
	for _, line := range strings.Split(logs.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil {
			if msg, _ := m["msg"].(string); msg == "cannot start" || strings.HasPrefix(msg, "stopped ") {
				msgs = append(msgs, msg)
			}
		}
	}
	want := []string{"cannot start", "stopped admin listener", "stopped app registry and background work", "stopped publish pool",
		"stopped loops", "stopped publish path and broker", "stopped webhooks", "stopped store"}
	if !slices.Equal(msgs, want) {
		t.Fatalf("log:\n%s\nwant, in order: %q", strings.Join(msgs, "\n"), want)
	}
	admin := logAddr(logs.String(), "admin listening")
	if admin == "" {
		t.Fatalf("no admin address logged\n%s", logs)
	}
	if c, err := net.Dial("tcp", admin); err == nil {
		c.Close()
		t.Fatalf("the admin listener %s still accepts after the failed start", admin)
	}
}
