package proxy

import (
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/roost-chat/roost/fanout/hooknet"
)

// A proxy hook never calls a link-local address nor one of the node's own
// listeners, over the direct client and over net/http (https, or a
// custom transport's absence): the call fails without a connection, and
// the app's fail mode answers it. A backend elsewhere is called.
func TestHookAddressesRefused(t *testing.T) {
	var calls atomic.Int32
	own := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		_, _ = w.Write([]byte(`{"allow":true}`))
	}))
	defer own.Close()
	defer hooknet.Default.Own("admin", own.Listener.Addr().(*net.TCPAddr))()
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"allow":true}`))
	}))
	defer other.Close()
	p := directPool(t)
	for _, url := range []string{own.URL + "/hook", "http://169.254.169.254:9/hook", "https://169.254.169.254:9/hook"} {
		c := askOne(t, p, Connect, Target{URL: url, Timeout: 2 * time.Second})
		if c.Result != Failed || c.Allow {
			t.Errorf("%s: result %s, allow %v: want error, refused (fail closed)", url, ResultNames[c.Result], c.Allow)
		}
	}
	if n := calls.Load(); n != 0 {
		t.Fatalf("the node's own listener was called %d times", n)
	}
	if c := askOne(t, p, Connect, Target{URL: other.URL + "/hook", Timeout: 2 * time.Second}); c.Result != Allowed {
		t.Fatalf("a loopback backend elsewhere: %s", ResultNames[c.Result])
	}
}
