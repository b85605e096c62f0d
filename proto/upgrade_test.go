package proto

import (
	"bufio"
	"bytes"
	"net/http"
	"strings"
	"testing"
)

const sampleKey = "dGhlIHNhbXBsZSBub25jZQ=="

func upgradeRequest(extra string) string {
	return "GET /ws?user=alice&app=demo HTTP/1.1\r\n" +
		"Host: 127.0.0.1:8080\r\n" +
		"Upgrade: websocket\r\n" +
		"Connection: keep-alive, Upgrade\r\n" +
		"Sec-WebSocket-Key: " + sampleKey + "\r\n" +
		"Sec-WebSocket-Version: 13\r\n" + extra + "\r\n"
}

func TestParseRequest(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		err     *HTTPError
		upgrade bool
		path    string
		query   string
	}{
		{"upgrade", upgradeRequest(""), nil, true, "/ws", "user=alice&app=demo"},
		{"case-insensitive", "GET /ws HTTP/1.1\r\nhOST: x\r\nupgrade:   WebSocket  \r\nCONNECTION: upgrade\r\nsec-websocket-key:\t" + sampleKey + "\r\nSEC-WEBSOCKET-VERSION: 13\r\n\r\n", nil, true, "/ws", ""},
		{"connection in two headers", "GET /ws HTTP/1.1\r\nConnection: keep-alive\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: " + sampleKey + "\r\nSec-WebSocket-Version: 13\r\n\r\n", nil, true, "/ws", ""},
		{"plain GET", "GET /health HTTP/1.1\r\nHost: x\r\n\r\n", nil, false, "/health", ""},
		{"plain GET 1.0", "GET /metrics?x=1 HTTP/1.0\r\n\r\n", nil, false, "/metrics", "x=1"},
		{"no connection upgrade", "GET /ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: keep-alive\r\n\r\n", nil, false, "/ws", ""},
		{"upgrade h2c", "GET / HTTP/1.1\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n", nil, false, "/", ""},
		{"empty query", "GET /ws? HTTP/1.1\r\n\r\n", nil, false, "/ws", ""},
		{"empty header value", "GET / HTTP/1.1\r\nX-Empty:\r\n\r\n", nil, false, "/", ""},

		{"version 13 missing", "GET /ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: " + sampleKey + "\r\n\r\n", ErrWebSocketVersion, true, "/ws", ""},
		{"version 8", strings.Replace(upgradeRequest(""), "Version: 13", "Version: 8", 1), ErrWebSocketVersion, true, "/ws", ""},
		{"key missing", strings.Replace(upgradeRequest(""), "Sec-WebSocket-Key: "+sampleKey+"\r\n", "", 1), ErrWebSocketKey, true, "", ""},
		{"key short", strings.Replace(upgradeRequest(""), sampleKey, "dGhlIHNhbXBsZSBub25jZQ=", 1), ErrWebSocketKey, true, "", ""},
		{"key not base64", strings.Replace(upgradeRequest(""), sampleKey, "dGhlIHNhbXBsZSBub25jZ!==", 1), ErrWebSocketKey, true, "", ""},
		{"key padding bits", strings.Replace(upgradeRequest(""), sampleKey, "dGhlIHNhbXBsZSBub25jZR==", 1), ErrWebSocketKey, true, "", ""},
		{"key 17 bytes", strings.Replace(upgradeRequest(""), sampleKey, "dGhlIHNhbXBsZSBub25jZQ==AA", 1), ErrWebSocketKey, true, "", ""},
		{"upgrade on 1.0", strings.Replace(upgradeRequest(""), "HTTP/1.1", "HTTP/1.0", 1), ErrUpgradeHTTP10, true, "", ""},
		{"POST", strings.Replace(upgradeRequest(""), "GET", "POST", 1), ErrMethod, false, "", ""},
		// HEAD is answered as GET without the body; it never upgrades.
		{"HEAD", "HEAD /roost.js HTTP/1.1\r\n\r\n", nil, false, "/roost.js", ""},
		{"HEAD upgrade", strings.Replace(upgradeRequest(""), "GET", "HEAD", 1), nil, false, "/ws", "user=alice&app=demo"},
		{"lower get", "get / HTTP/1.1\r\n\r\n", ErrMethod, false, "", ""},
		{"HTTP/2.0", "GET / HTTP/2.0\r\n\r\n", ErrVersion, false, "", ""},
		{"HTTP/0.9", "GET / HTTP/0.9\r\n\r\n", ErrVersion, false, "", ""},
		{"version junk", "GET / HTTP/1.10\r\n\r\n", ErrBadRequestLine, false, "", ""},
		{"version lower", "GET / http/1.1\r\n\r\n", ErrBadRequestLine, false, "", ""},
		{"no version", "GET /\r\n\r\n", ErrBadRequestLine, false, "", ""},
		{"double space", "GET  / HTTP/1.1\r\n\r\n", ErrBadRequestLine, false, "", ""},
		{"trailing space", "GET / HTTP/1.1 \r\n\r\n", ErrBadRequestLine, false, "", ""},
		{"empty line first", "\r\n\r\n", ErrBadRequestLine, false, "", ""},
		{"absolute-form", "GET http://x/ws HTTP/1.1\r\n\r\n", ErrBadRequestLine, false, "", ""},
		{"no slash", "GET ws HTTP/1.1\r\n\r\n", ErrBadRequestLine, false, "", ""},
		{"target ctl", "GET /a\x01b HTTP/1.1\r\n\r\n", ErrBadRequestLine, false, "", ""},
		{"method ctl", "G\x00T / HTTP/1.1\r\n\r\n", ErrBadRequestLine, false, "", ""},
		{"header no colon", "GET / HTTP/1.1\r\nHost x\r\n\r\n", ErrBadHeader, false, "", ""},
		{"header space before colon", "GET / HTTP/1.1\r\nHost : x\r\n\r\n", ErrBadHeader, false, "", ""},
		{"header empty name", "GET / HTTP/1.1\r\n: x\r\n\r\n", ErrBadHeader, false, "", ""},
		{"obs-fold", "GET / HTTP/1.1\r\nHost: x\r\n y\r\n\r\n", ErrBadHeader, false, "", ""},
		{"bare LF in value", "GET / HTTP/1.1\r\nHost: x\ny: z\r\n\r\n", ErrBadHeader, false, "", ""},
		{"bare CR in value", "GET / HTTP/1.1\r\nHost: x\ry\r\n\r\n", ErrBadHeader, false, "", ""},
		{"too large", "GET / HTTP/1.1\r\nX: " + strings.Repeat("a", MaxRequestHead) + "\r\n\r\n", ErrHeadTooLarge, false, "", ""},
	}
	var r Request
	for _, tt := range tests {
		n, err := ParseRequest([]byte(tt.in+"trailing frame bytes"), &r)
		if tt.err != nil {
			if err != tt.err || n != 0 {
				t.Errorf("%s: n=%d err=%v, want %v", tt.name, n, err, tt.err)
			}
		} else if err != nil || n != len(tt.in) || r.Upgrade != tt.upgrade || string(r.Path) != tt.path || string(r.Query) != tt.query || string(r.Method) != "GET" && !r.Head {
			t.Errorf("%s: n=%d/%d err=%v upgrade=%v path=%q query=%q", tt.name, n, len(tt.in), err, r.Upgrade, r.Path, r.Query)
		}
		if tt.err == nil && tt.upgrade && string(r.Key) != sampleKey {
			t.Errorf("%s: key %q", tt.name, r.Key)
		}
		checkRequestSplits(t, []byte(tt.in))
	}
}

func TestParseRequestSize(t *testing.T) {
	var r Request
	pad := func(total int) []byte {
		base := "GET / HTTP/1.1\r\nX: \r\n\r\n"
		return []byte(strings.Replace(base, "X: ", "X: "+strings.Repeat("a", total-len(base)), 1))
	}
	if n, err := ParseRequest(pad(MaxRequestHead), &r); n != MaxRequestHead || err != nil {
		t.Fatalf("head of exactly %d: n=%d err=%v", MaxRequestHead, n, err)
	}
	if n, err := ParseRequest(pad(MaxRequestHead+1), &r); n != 0 || err != ErrHeadTooLarge {
		t.Fatalf("head of %d: n=%d err=%v", MaxRequestHead+1, n, err)
	}
	if n, err := ParseRequest(bytes.Repeat([]byte("a"), MaxRequestHead-1), &r); n != 0 || err != nil {
		t.Fatalf("incomplete: n=%d err=%v", n, err)
	}
	if n, err := ParseRequest(bytes.Repeat([]byte("a"), MaxRequestHead), &r); n != 0 || err != ErrHeadTooLarge {
		t.Fatalf("8192 bytes without end: n=%d err=%v", n, err)
	}
}

// checkRequestSplits: every proper prefix of a request either waits (n=0,
// no error) or, once past MaxRequestHead, fails as the whole does.
func checkRequestSplits(t *testing.T, in []byte) {
	t.Helper()
	var r, whole Request
	n, err := ParseRequest(in, &whole)
	for k := 0; k < len(in); k++ {
		pn, perr := ParseRequest(in[:k], &r)
		if perr != nil {
			if perr != err {
				t.Fatalf("prefix %d of %q: %v, whole %v", k, in, perr, err)
			}
			continue
		}
		if pn != 0 && (pn != n || err != nil) {
			t.Fatalf("prefix %d of %q: n=%d, whole n=%d err=%v", k, in, pn, n, err)
		}
	}
}

func FuzzRequest(f *testing.F) {
	f.Fuzz(func(t *testing.T, in []byte) {
		var r Request
		n, err := ParseRequest(in, &r)
		if n < 0 || n > len(in) || n > MaxRequestHead || (err != nil && n != 0) {
			t.Fatalf("n=%d err=%v", n, err)
		}
		if err == nil && n > 0 {
			if !bytes.HasSuffix(in[:n], []byte("\r\n\r\n")) || string(r.Method) != "GET" {
				t.Fatalf("n=%d method %q", n, r.Method)
			}
			if r.Upgrade && !validKey(r.Key) {
				t.Fatalf("bad key accepted: %q", r.Key)
			}
			// net/http reads whatever we accept (it accepts more).
			if _, e := http.ReadRequest(bufio.NewReader(bytes.NewReader(in[:n]))); e != nil {
				t.Fatalf("%q accepted, net/http says %v", in[:n], e)
			}
		}
		checkRequestSplits(t, in)
	})
}

// TestAcceptKey uses the sample of RFC 6455 section 1.3, whose accept value
// is s3pPLMBiTxaQ9kYGzzhZRbK+xOo= (openssl and Python's hashlib agree).
func TestAcceptKey(t *testing.T) {
	got := AppendUpgradeResponse(nil, []byte(sampleKey))
	want := "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n"
	if string(got) != want {
		t.Fatalf("got %q", got)
	}
	// The slow path for oversized keys computes the same function.
	long := bytes.Repeat([]byte("k"), 100)
	a := AppendUpgradeResponse(nil, long)
	if !bytes.Contains(a, []byte("Sec-WebSocket-Accept: ")) || len(a) != len(want) {
		t.Fatalf("long key: %q", a)
	}
}

func TestHTTPResponses(t *testing.T) {
	got := AppendHTTPResponseHeaders(nil, 200, "application/json", "", []byte(`{"ok":true}`))
	want := "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\nConnection: close\r\n\r\n{\"ok\":true}"
	if string(got) != want {
		t.Fatalf("got %q", got)
	}
	for _, e := range []*HTTPError{ErrBadRequestLine, ErrBadHeader, ErrVersion, ErrMethod, ErrHeadTooLarge, ErrWebSocketVersion, ErrWebSocketKey, ErrUpgradeHTTP10} {
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(AppendHTTPError(nil, e))), nil)
		if err != nil {
			t.Fatalf("%v: %v", e, err)
		}
		var body bytes.Buffer
		body.ReadFrom(resp.Body)
		if e.Error() != e.Reason {
			t.Errorf("%v: Error() = %q", e, e.Error())
		}
		if resp.StatusCode != e.Status || body.String() != e.Reason+"\n" || !resp.Close {
			t.Errorf("%v: status %d body %q", e, resp.StatusCode, body.String())
		}
		if v := resp.Header.Get("Sec-WebSocket-Version"); (e.Status == 426) != (v == "13") {
			t.Errorf("%v: Sec-WebSocket-Version %q", e, v)
		}
	}
}

func TestNotModifiedAndIfNoneMatch(t *testing.T) {
	var r Request
	in := "GET /roost.js HTTP/1.1\r\nHost: x\r\nIf-None-Match:  \"abc\" \r\n\r\n"
	if n, err := ParseRequest([]byte(in), &r); err != nil || n != len(in) || string(r.IfNoneMatch) != `"abc"` {
		t.Fatalf("n %d err %v If-None-Match %q", n, err, r.IfNoneMatch)
	}
	got := AppendHTTPResponseHeaders(nil, 304, "text/javascript", "ETag: \"abc\"\r\n", []byte("body"))
	want := "HTTP/1.1 304 Not Modified\r\nContent-Type: text/javascript\r\nETag: \"abc\"\r\nConnection: close\r\n\r\n"
	if string(got) != want {
		t.Fatalf("got %q", got)
	}
}

func TestQueryValue(t *testing.T) {
	tests := []struct {
		query, name, want string
		ok                bool
	}{
		{"user=alice&app=demo", "user", "alice", true},
		{"user=alice&app=demo", "app", "demo", true},
		{"user=alice&app=demo", "token", "", false},
		{"token=a.b.c", "token", "a.b.c", true},
		{"u=a+b%20c%2B%26", "u", "a b c+&", true},
		{"%75ser=x", "user", "x", true},
		{"user", "user", "", true},
		{"user=", "user", "", true},
		{"user=1&user=2", "user", "1", true},
		{"users=1&user=2", "user", "2", true},
		{"user=%zz", "user", "", false},
		{"user=%2", "user", "", false},
		{"=x&user=%e2%9c%93", "user", "✓", true},
		{"", "user", "", false},
	}
	for _, tt := range tests {
		got, ok := QueryValue([]byte(tt.query), tt.name, []byte("pre:"))
		if ok != tt.ok || (ok && string(got) != "pre:"+tt.want) || (!ok && string(got) != "pre:") {
			t.Errorf("QueryValue(%q, %q) = %q, %v", tt.query, tt.name, got, ok)
		}
	}
}

func TestUpgradeAllocs(t *testing.T) {
	in := []byte(upgradeRequest(""))
	var r Request
	dst := make([]byte, 0, 256)
	if a := testing.AllocsPerRun(100, func() {
		n, err := ParseRequest(in, &r)
		if n == 0 || err != nil {
			t.Fatal(n, err)
		}
		dst, _ = QueryValue(r.Query, "user", dst[:0])
		dst = AppendUpgradeResponse(dst[:0], r.Key)
	}); a != 0 {
		t.Fatalf("allocates %v", a)
	}
}

var sinkInt int

func BenchmarkParseRequest(b *testing.B) {
	in := []byte(upgradeRequest("User-Agent: roost-bench/1\r\nOrigin: http://localhost\r\n"))
	var r Request
	b.ReportAllocs()
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		n, err := ParseRequest(in, &r)
		if err != nil {
			b.Fatal(err)
		}
		sinkInt = n
	}
}

func BenchmarkAppendUpgradeResponse(b *testing.B) {
	dst := make([]byte, 0, 256)
	key := []byte(sampleKey)
	b.ReportAllocs()
	for b.Loop() {
		dst = AppendUpgradeResponse(dst[:0], key)
	}
}

// Authorization and If-None-Match share a name length: both are read.
func TestAuthorizationHeader(t *testing.T) {
	in := "GET /ws?x=1 HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nauthorization:  Bearer a.b.c \r\nIf-None-Match: \"e\"\r\n\r\n"
	var r Request
	if n, err := ParseRequest([]byte(in), &r); err != nil || n != len(in) || string(r.Authorization) != "Bearer a.b.c" || string(r.IfNoneMatch) != `"e"` {
		t.Fatalf("n %d err %v Authorization %q If-None-Match %q", n, err, r.Authorization, r.IfNoneMatch)
	}
	if _, err := ParseRequest([]byte("GET /ws HTTP/1.1\r\nHost: x\r\n\r\n"), &r); err != nil || r.Authorization != nil {
		t.Fatalf("absent header: %v %q", err, r.Authorization)
	}
}
