package test

// TLS in front of the node: Debian's HAProxy and nginx terminate TLS with a
// certificate the test makes, run the configurations docs/operations.md
// gives (read from it, only addresses and file names replaced), and pass
// wss and https SSE clients through to a node; the node must see the
// clients' own address (they dial from 127.0.0.2, the proxies connect from
// 127.0.0.1).

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/roost-chat/roost/proto/prototest"
	"github.com/roost-chat/roost/pubsub/redistest"
	"github.com/roost-chat/roost/test/harness"
)

// sbinTool finds a daemon of a Debian package, which lives in /usr/sbin
// (not on every user's PATH); needTool skips or, under CI=true, fails.
func sbinTool(t testing.TB, name, pkg string) string {
	if p := "/usr/sbin/" + name; fileExists(p) {
		return p
	}
	return needTool(t, name, "apt-get install -y "+pkg)
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// tlsFiles is a self-signed certificate for 127.0.0.1 in the forms the
// proxies read, and a pool that trusts it.
type tlsFiles struct {
	crt, key, pem string
	pool          *x509.CertPool
}

func selfSigned(t testing.TB, dir string) tlsFiles {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: "roost test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	f := tlsFiles{crt: filepath.Join(dir, "roost.crt"), key: filepath.Join(dir, "roost.key"), pem: filepath.Join(dir, "roost.pem"), pool: x509.NewCertPool()}
	f.pool.AddCert(cert)
	crtPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
	for path, b := range map[string][]byte{f.crt: crtPEM, f.key: keyPEM, f.pem: append(append([]byte{}, crtPEM...), keyPEM...)} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// docConfig returns the fenced block of docs/operations.md whose info
// string is lang.
func docConfig(t testing.TB, lang string) string {
	t.Helper()
	b, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)\n```" + regexp.QuoteMeta(lang) + "\n(.*?)\n```\n").FindSubmatch(b)
	if m == nil {
		t.Fatalf("docs/operations.md has no ```%s block", lang)
	}
	return string(m[1])
}

// replaceAll replaces each old of pairs in s, failing when one is absent
// (the documented configuration changed under the test).
func replaceAll(t testing.TB, s string, pairs ...string) string {
	t.Helper()
	for i := 0; i < len(pairs); i += 2 {
		if !strings.Contains(s, pairs[i]) {
			t.Fatalf("configuration has no %q:\n%s", pairs[i], s)
		}
		s = strings.ReplaceAll(s, pairs[i], pairs[i+1])
	}
	return s
}

// frontProxy is a running HAProxy or nginx.
type frontProxy struct {
	addr   string // host:port of its TLS listener
	cmd    *exec.Cmd
	log    *harness.SyncBuffer
	exited chan struct{}
}

// pids are the proxy's processes (nginx: master and workers).
func (p *frontProxy) pids() []int {
	pids := []int{p.cmd.Process.Pid}
	out, _ := exec.Command("pgrep", "-P", fmt.Sprint(p.cmd.Process.Pid)).Output()
	for _, f := range strings.Fields(string(out)) {
		var pid int
		if _, err := fmt.Sscan(f, &pid); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

func startProxy(t testing.TB, name string, args ...string) *frontProxy {
	t.Helper()
	p := &frontProxy{log: &harness.SyncBuffer{}}
	p.cmd = exec.Command(name, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	p.cmd.SysProcAttr = harness.ChildAttr()
	p.cmd.SysProcAttr.Setpgid = true // nginx's workers die with the group
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	p.exited = exited
	go func() { _ = p.cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		// The whole group: nginx's workers are the master's children.
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		if t.Failed() {
			t.Logf("--- %s output ---\n%s", name, p.log.String())
		}
	})
	return p
}

// waitListening waits until addr accepts, or the proxy has exited.
func (p *frontProxy) waitListening(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", p.addr, 200*time.Millisecond); err == nil {
			c.Close()
			return
		}
		select {
		case <-p.exited:
			t.Fatalf("proxy exited:\n%s", p.log.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatalf("proxy not listening on %s:\n%s", p.addr, p.log.String())
}

// startHAProxy runs the documented HAProxy configuration in front of node.
func startHAProxy(t testing.TB, node string, f tlsFiles, dir string) *frontProxy {
	bin := sbinTool(t, "haproxy", "haproxy")
	addr := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t, false))
	cfg := replaceAll(t, docConfig(t, "haproxy"),
		"maxconn 50000", "maxconn 9000", // two descriptors a connection, under this machine's 20000
		"bind :443 ", "bind "+addr+" ",
		"/etc/haproxy/roost.pem", f.pem,
		"127.0.0.1:8080", node)
	path := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, bin, "-db", "-f", path)
	p.addr = addr
	p.waitListening(t)
	return p
}

// startNginx runs the documented nginx configuration (lang: nginx-stream
// or nginx-http) in front of node, under a main configuration of the
// test's own (its files in dir, in the foreground).
func startNginx(t testing.TB, lang, node string, f tlsFiles, dir string) *frontProxy {
	bin := sbinTool(t, "nginx", "nginx")
	addr := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t, false))
	cfg := replaceAll(t, docConfig(t, lang),
		"listen 443 ssl;", "listen "+addr+" ssl;",
		"/etc/nginx/roost.crt", f.crt,
		"/etc/nginx/roost.key", f.key,
		"127.0.0.1:8080", node)
	main := "daemon off;\nworker_processes 1;\nworker_rlimit_nofile 20000;\npid " + dir + "/nginx.pid;\nerror_log " + dir + "/error.log warn;\n" +
		"events { worker_connections 16000; }\n"
	if lang == "nginx-stream" {
		const mod = "/usr/lib/nginx/modules/ngx_stream_module.so"
		if !fileExists(mod) {
			needTool(t, mod, "apt-get install -y libnginx-mod-stream")
		}
		main = "load_module " + mod + ";\n" + main
	} else {
		tmp := ""
		for _, k := range []string{"client_body", "proxy", "fastcgi", "uwsgi", "scgi"} {
			tmp += "    " + k + "_temp_path " + dir + "/" + k + ";\n"
		}
		cfg = replaceAll(t, cfg, "http {\n", "http {\n    access_log off;\n"+tmp)
	}
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(main+cfg+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, bin, "-p", dir, "-e", dir+"/error.log", "-c", path)
	p.addr = addr
	p.waitListening(t)
	return p
}

// fromClientAddr dials from 127.0.0.2: the address the node must see.
var fromClientAddr = (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 5 * time.Second}).DialContext

func TestTLSProxyInFront(t *testing.T) {
	cases := []struct {
		name     string
		nodeFlag []string
		start    func(t *testing.T, node string, f tlsFiles, dir string) *frontProxy
		withPort bool // the node learns the client's port too (PROXY header)
	}{
		{"haproxy send-proxy-v2", []string{"--proxy-protocol"}, func(t *testing.T, node string, f tlsFiles, dir string) *frontProxy {
			return startHAProxy(t, node, f, dir)
		}, true},
		{"nginx stream proxy_protocol", []string{"--proxy-protocol"}, func(t *testing.T, node string, f tlsFiles, dir string) *frontProxy {
			return startNginx(t, "nginx-stream", node, f, dir)
		}, true},
		{"nginx http X-Forwarded-For", []string{"--trusted-proxies", "127.0.0.1/32"}, func(t *testing.T, node string, f tlsFiles, dir string) *frontProxy {
			return startNginx(t, "nginx-http", node, f, dir)
		}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			f := selfSigned(t, dir)
			n := plainNode(t, 0, false, append([]string{"--log-level", "debug"}, tc.nodeFlag...)...)
			p := tc.start(t, n.Addr, f, dir)
			throughProxy(t, n, p, f, tc.withPort)
			if tc.nodeFlag[0] == "--proxy-protocol" {
				// Past the proxy, straight to the node: refused and counted.
				resp, err := httpClient.Get("http://" + n.Addr + "/roost.js")
				if err == nil {
					if resp.StatusCode != 400 {
						t.Errorf("direct request: %s, want 400", resp.Status)
					}
					resp.Body.Close()
				}
				if v := n.Metrics(t)[`roost_connections_refused_total{reason="proxy_header"}`]; v < 1 {
					t.Errorf("direct request not counted: refused proxy_header %v", v)
				}
			}
		})
	}
}

// throughProxy: an SSE listener over https and a WebSocket client over
// wss, both from 127.0.0.2 through p, in one room; the WebSocket client's
// publish reaches both, and the node's log names 127.0.0.2 for each.
func throughProxy(t *testing.T, n *roostNode, p *frontProxy, f tlsFiles, withPort bool) {
	tlsCfg := &tls.Config{RootCAs: f.pool, ServerName: "127.0.0.1"}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg, DialContext: fromClientAddr}}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", "https://"+p.addr+"/sse?room=r&user=listener&app="+testApp, nil)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("sse through the proxy: %s %s", resp.Status, resp.Header.Get("Content-Type"))
	}
	events := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			events <- sc.Text()
		}
		close(events)
	}()

	ws := prototest.DialT(t, "wss://"+p.addr+"/ws?user=writer&app="+testApp, prototest.Options{TLSConfig: tlsCfg, NetDial: fromClientAddr})
	if err := ws.Send(`{"op":"join","room":"r"}`); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ws.Expect("joined", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := ws.Send(`{"op":"pub","room":"r","id":"m1","body":{"text":"through the proxy"}}`); err != nil {
		t.Fatal(err)
	}
	// Its own msg and the ack, in either order.
	for seen := map[string]bool{}; !seen["ack"] || !seen["msg"]; {
		fr, err := ws.Next(5 * time.Second)
		if err != nil {
			t.Fatalf("after the pub (seen %v): %v", seen, err)
		}
		seen[fmt.Sprint(fr.Map()["op"])] = true
	}
	for got := false; !got; {
		select {
		case line, ok := <-events:
			if !ok {
				t.Fatal("sse stream ended before the message")
			}
			got = strings.HasPrefix(line, "data:") && strings.Contains(line, "through the proxy")
		case <-ctx.Done():
			t.Fatal("no message on the sse stream")
		}
	}

	// The node saw the clients, not the proxy.
	wsFrom := "remote=127.0.0.2"
	if withPort {
		wsFrom += ":" + fmt.Sprint(ws.Conn().LocalAddr().(*net.TCPAddr).Port)
	}
	prototest.WaitFor(t, 5*time.Second, func() error {
		log := n.LogTail(200)
		for _, want := range []*regexp.Regexp{
			regexp.MustCompile(`msg="connection open".* ` + regexp.QuoteMeta(wsFrom) + `(\s|$)`),
			regexp.MustCompile(`msg="sse stream open".* remote=127\.0\.0\.2[:\s]`),
		} {
			if !want.MatchString(log) {
				return fmt.Errorf("node log has no %s:\n%s", want, log)
			}
		}
		if strings.Contains(log, "remote=127.0.0.1") {
			return fmt.Errorf("node log names the proxy's address:\n%s", log)
		}
		return nil
	})
}

// pathRSS is the resident set of the processes, summed.
func pathRSS(tb testing.TB, pids ...int) float64 {
	var sum int64
	for _, pid := range pids {
		sum += rssBytes(tb, pid)
	}
	return float64(sum)
}

// BenchmarkProxyPathMemory measures the memory one idle connection costs
// the whole path, proxy plus node: ROOST_PATH_CONNS (default 5000) clients,
// each joined to a room of its own and then silent, straight to the node
// (ws://) and through each documented proxy configuration (wss://, https
// for none: SSE streams cost the proxies what a WebSocket does). It
// reports the growth of the node's and the proxy's RSS over the idle
// baseline, per connection. Kernel socket memory is not in RSS. Run once:
//
//	go test -run '^$' -bench BenchmarkProxyPathMemory -benchtime 1x .
func BenchmarkProxyPathMemory(b *testing.B) {
	conns := 5000
	if v := os.Getenv("ROOST_PATH_CONNS"); v != "" {
		if _, err := fmt.Sscan(v, &conns); err != nil || conns < 1 || conns > 8000 {
			b.Fatalf("ROOST_PATH_CONNS=%q: want 1..8000 (each holds descriptors under the 20000 cap)", v)
		}
	}
	paths := []struct {
		name  string
		flags []string
		start func(t testing.TB, node string, f tlsFiles, dir string) *frontProxy
	}{
		{"direct", nil, nil},
		{"haproxy", []string{"--proxy-protocol"}, startHAProxy},
		{"nginx-stream", []string{"--proxy-protocol"}, func(t testing.TB, node string, f tlsFiles, dir string) *frontProxy {
			return startNginx(t, "nginx-stream", node, f, dir)
		}},
		{"nginx-http", []string{"--trusted-proxies", "127.0.0.1/32"}, func(t testing.TB, node string, f tlsFiles, dir string) *frontProxy {
			return startNginx(t, "nginx-http", node, f, dir)
		}},
	}
	for _, path := range paths {
		b.Run(path.name, func(b *testing.B) {
			dir := b.TempDir()
			f := selfSigned(b, dir)
			n := plainNode(b, 0, false, path.flags...)
			url := "ws://" + n.Addr
			opt := prototest.Options{Buffer: 4, ReadTimeout: 10 * time.Minute}
			var p *frontProxy
			if path.start != nil {
				p = path.start(b, n.Addr, f, dir)
				url = "wss://" + p.addr
				opt.TLSConfig = &tls.Config{RootCAs: f.pool, ServerName: "127.0.0.1"}
			}
			proxyRSS := func() float64 {
				if p == nil {
					return 0
				}
				return pathRSS(b, p.pids()...)
			}
			// A few connections first: what every proxy and node allocates
			// on its first connection (TLS contexts, buffers, pools) is not
			// a per-connection cost.
			warm := dialMany(b, url, opt, 0, 20)
			time.Sleep(time.Second)
			node0, proxy0 := pathRSS(b, n.Cmd.Process.Pid), proxyRSS()
			clients := dialMany(b, url, opt, 20, conns)
			time.Sleep(2 * time.Second) // let the last joins and the proxies' buffers settle
			node1, proxy1 := pathRSS(b, n.Cmd.Process.Pid), proxyRSS()
			nodePer, proxyPer := (node1-node0)/float64(conns), (proxy1-proxy0)/float64(conns)
			b.ReportMetric(nodePer, "node-B/conn")
			b.ReportMetric(proxyPer, "proxy-B/conn")
			b.ReportMetric(nodePer+proxyPer, "path-B/conn")
			b.Logf("%s: %d idle joined connections: node RSS %.1f -> %.1f MiB, proxy RSS %.1f -> %.1f MiB",
				path.name, conns, node0/(1<<20), node1/(1<<20), proxy0/(1<<20), proxy1/(1<<20))
			for _, c := range append(warm, clients...) {
				c.Close()
			}
		})
	}
}

// dialMany opens clients from..to-1 on url, 32 at a time, each joined to
// its own room, from 127.0.0.2.
func dialMany(b *testing.B, url string, opt prototest.Options, from, to int) []*prototest.Client {
	b.Helper()
	opt.NetDial = fromClientAddr
	out := make([]*prototest.Client, to-from)
	errs := make(chan error, to-from)
	sem := make(chan struct{}, 32)
	for i := from; i < to; i++ {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c, err := prototest.Dial(ctx, fmt.Sprintf("%s/ws?user=u%d&app=%s", url, i, testApp), opt)
			if err == nil {
				err = c.Send(fmt.Sprintf(`{"op":"join","room":"r%d"}`, i))
			}
			if err == nil {
				_, _, err = c.Expect("joined", 30*time.Second)
			}
			out[i-from] = c
			errs <- err
		}()
	}
	for range to - from {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	return out
}

// The server API believes X-Forwarded-For from a trusted proxy only: in
// development mode, where a request without a secret is admitted from
// loopback alone, a trusted peer naming a remote client is refused, and an
// untrusted peer's header is ignored.
func TestServerAPITrustedProxies(t *testing.T) {
	api := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t, false))
	plainNode(t, 0, false, "--api", api, "--trusted-proxies", "127.0.0.1/32")
	post := func(dial func(ctx context.Context, network, addr string) (net.Conn, error), xff string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("POST", "http://"+api+"/v1/apps/demo/rooms/lobby/messages", strings.NewReader(`{"id":"k-1","from":"bot","body":"hi"}`))
		if xff != "" {
			req.Header.Set("X-Forwarded-For", xff)
		}
		hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: dial}}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		_, _ = bufio.NewReader(resp.Body).WriteTo(&b)
		return resp.StatusCode, b.String()
	}
	direct := (&net.Dialer{Timeout: 5 * time.Second}).DialContext
	for _, tc := range []struct {
		name string
		dial func(ctx context.Context, network, addr string) (net.Conn, error)
		xff  string
		code int
	}{
		{"trusted peer, no header: loopback", direct, "", 200},
		{"trusted peer names a remote client", direct, "127.0.0.9, 192.0.2.7", 401},
		{"trusted peer names a loopback client", direct, "192.0.2.7, 127.0.0.9", 200},
		{"untrusted peer: its header is ignored", fromClientAddr, "192.0.2.7", 200},
	} {
		if code, body := post(tc.dial, tc.xff); code != tc.code {
			t.Errorf("%s: %d %s, want %d", tc.name, code, body, tc.code)
		}
	}
}
