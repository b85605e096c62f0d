package loop

import (
	"bufio"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// procListenersWhole is the former reading of the tables (the file read
// whole, split, every line's fields made): the reference procListeners
// must agree with.
func procListenersWhole(f string, port uint64, ip netip.Addr, listening []string) []string {
	b, err := os.ReadFile(f)
	if err != nil {
		return listening
	}
	for _, line := range strings.Split(string(b), "\n")[1:] {
		fl := strings.Fields(line)
		if len(fl) < 10 || fl[3] != "0A" { // 0A: LISTEN
			continue
		}
		hexIP, hexPort, ok := strings.Cut(fl[1], ":")
		if p, err := strconv.ParseUint(hexPort, 16, 16); !ok || err != nil || p != port {
			continue
		}
		if theirs, ok := procAddr(hexIP); ok && ip.IsValid() && !ip.IsUnspecified() && !theirs.IsUnspecified() && theirs != ip {
			continue
		}
		listening = append(listening, fl[9])
	}
	return listening
}

const procHeader = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"

// procTCPLine formats a line as the kernel does for /proc/net/tcp.
func procTCPLine(sl int, local string, port uint16, st string, inode int) string {
	return fmt.Sprintf("%4d: %s:%04X 0100007F:D431 %s 00000000:00000000 00:00000000 00000000  1000        0 %d 1 0000000000000000 20 4 30 10 -1                     \n",
		sl, local, port, st, inode)
}

// writeProcTable writes a synthetic table of n lines: mostly established
// sockets, with listeners on 8080 at 127.0.0.1, 127.0.0.2 and 0.0.0.0
// among them.
func writeProcTable(t testing.TB, n int) string {
	var sb strings.Builder
	sb.WriteString(procHeader)
	for i := 0; i < n; i++ {
		switch i % 25000 {
		case 100:
			sb.WriteString(procTCPLine(i, "0100007F", 8080, "0A", 100000+i))
		case 200:
			sb.WriteString(procTCPLine(i, "0200007F", 8080, "0A", 100000+i))
		case 300:
			sb.WriteString(procTCPLine(i, "00000000", 8080, "0A", 100000+i))
		case 400:
			sb.WriteString(procTCPLine(i, "0100007F", 9090, "0A", 100000+i))
		default:
			sb.WriteString(procTCPLine(i, "0100007F", 8080, "01", 100000+i))
		}
	}
	f := filepath.Join(t.TempDir(), "tcp")
	if err := os.WriteFile(f, []byte(sb.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestProcListenersMatchesWhole(t *testing.T) {
	dir := t.TempDir()
	odd := procHeader +
		procTCPLine(0, "0100007F", 8080, "0A", 11) +
		"   1: 0100007F:1F90 0100007F:D431 0A 00000000:00000000 00:00000000 00000000  1000 0 12\n" + // exactly ten fields
		"   2: 0100007F:1F90 0100007F:D431 0A short\n" +
		"   3: 0100007F:1F90 0100007F:D431 0A 00000000:00000000 00:00000000 00000000 1000 0 13 " + strings.Repeat("x", 3*procBuf) + "\n" + // longer than the buffer
		"   4: 0100007F:1F9Z 0100007F:D431 0A 00000000:00000000 00:00000000 00000000 1000 0 14 1\n" + // bad port
		"   5: 0100007F:11F90 0100007F:D431 0A 00000000:00000000 00:00000000 00000000 1000 0 15 1\n" + // port over 16 bits
		"   6: 0100007G:1F90 0100007F:D431 0A 00000000:00000000 00:00000000 00000000 1000 0 16 1\n" + // bad address: kept
		"   7: 0100007F1F90 0100007F:D431 0A 00000000:00000000 00:00000000 00000000 1000 0 17 1\n" + // no colon
		"\n\n" +
		"   8: 0100007F:1f90 0100007F:D431 0A 00000000:00000000 00:00000000 00000000 1000 0 18 1\n" + // lower-case hex
		"   9: 0200007F:1F90 0100007F:D431 0A 00000000:00000000 00:00000000 00000000 1000 0 19 1\n" +
		"  10: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000 1000 0 20 1\n" + // ::1
		"  11: 0000000000000000FFFF00000100007F:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000 1000 0 21 1\n" + // v4-mapped
		"  12: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000 1000 0 22 1\n" + // ::
		"  13: 0100007F:1F90\t0100007F:D431\t0A\t00000000:00000000 00:00000000 00000000 1000 0 23 1\n" + // tabs
		"  14: 0100007F:1F90 0100007F:D431 0A 00000000:00000000 00:00000000 00000000 1000 0 24" // ten fields, no final newline
	files := map[string]string{}
	for name, body := range map[string]string{
		"odd":        odd,
		"empty":      "",
		"header":     strings.TrimSuffix(procHeader, "\n"),
		"longheader": strings.Repeat("h", 2*procBuf) + "\n" + procTCPLine(0, "0100007F", 8080, "0A", 31),
	} {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		files[name] = f
	}
	files["synthetic"] = writeProcTable(t, 60000)
	files["missing"] = filepath.Join(dir, "none")
	// This machine's tables, copied: the live ones change between reads.
	for _, name := range []string{"tcp", "tcp6"} {
		if b, err := os.ReadFile("/proc/net/" + name); err == nil {
			f := filepath.Join(dir, name)
			if err := os.WriteFile(f, b, 0o600); err != nil {
				t.Fatal(err)
			}
			files[name] = f
		}
	}

	// Every port that listens on this machine, besides the synthetic ones.
	ports := []uint64{0, 8080, 9090, 65535}
	if b, err := os.ReadFile(filepath.Join(dir, "tcp")); err == nil {
		for _, line := range strings.Split(string(b), "\n")[1:] {
			if fl := strings.Fields(line); len(fl) > 3 && fl[3] == "0A" {
				if _, hp, ok := strings.Cut(fl[1], ":"); ok {
					if p, err := strconv.ParseUint(hp, 16, 16); err == nil {
						ports = append(ports, p)
					}
				}
			}
		}
	}
	ips := []netip.Addr{{}, netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2"),
		netip.MustParseAddr("0.0.0.0"), netip.MustParseAddr("::1"), netip.MustParseAddr("::")}

	rd := bufio.NewReaderSize(nil, procBuf)
	found := 0
	for name, f := range files {
		ps := ports
		if name == "synthetic" { // big: its own ports only
			ps = []uint64{0, 8080, 9090}
		}
		for _, port := range ps {
			for _, ip := range ips {
				want := procListenersWhole(f, port, ip, []string{"seed"})
				got := procListeners(f, rd, port, ip, []string{"seed"})
				if !slices.Equal(got, want) {
					t.Errorf("%s port %d ip %v: got %v, want %v", name, port, ip, got, want)
				}
				found += len(got) - 1
			}
		}
	}
	if found == 0 {
		t.Fatal("no listener found in any table: the comparison proves nothing")
	}
	// The odd table's cases, spelled out once.
	got := procListeners(files["odd"], rd, 8080, netip.MustParseAddr("127.0.0.1"), nil)
	if want := []string{"11", "12", "13", "16", "18", "21", "22", "23", "24"}; !slices.Equal(got, want) {
		t.Errorf("odd table: got %v, want %v", got, want)
	}
}

// TestProcListenersBounded: a table of 100,000 sockets costs a handful of
// allocations (the file, the listeners kept), not one per line.
func TestProcListenersBounded(t *testing.T) {
	f := writeProcTable(t, 100000)
	rd := bufio.NewReaderSize(nil, procBuf)
	ip := netip.MustParseAddr("127.0.0.1")
	var got []string
	allocs := testing.AllocsPerRun(5, func() {
		got = procListeners(f, rd, 8080, ip, nil)
	})
	if len(got) != 8 { // 127.0.0.1 and 0.0.0.0 at each of 4 spots
		t.Fatalf("found %d listeners, want 8: %v", len(got), got)
	}
	if allocs > 20 {
		t.Fatalf("%v allocs for 100,000 lines, want a bounded handful", allocs)
	}
}

// BenchmarkProcListeners reads a 100,000-line table: stream (the current
// reading) against whole (the former). go test -bench ProcListeners
// -benchmem ./loop/ gives bytes/op of each.
func BenchmarkProcListeners(b *testing.B) {
	f := writeProcTable(b, 100000)
	ip := netip.MustParseAddr("127.0.0.1")
	b.Run("stream", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			rd := bufio.NewReaderSize(nil, procBuf)
			if len(procListeners(f, rd, 8080, ip, nil)) != 8 {
				b.Fatal("wrong listeners")
			}
		}
	})
	b.Run("whole", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if len(procListenersWhole(f, 8080, ip, nil)) != 8 {
				b.Fatal("wrong listeners")
			}
		}
	})
}
