package main

import (
	"go/build"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// layers is which packages of the module each package may import in its
// production code (tests may import more, to build a node): loop -> fanout
// -> persist/pubsub -> proto, main wires. A package not listed here fails
// the test until it is given its place; never (below) bounds what may be
// listed.
var layers = map[string][]string{
	".":                   {"*"}, // main wires everything
	"loop":                {"fanout", "fanout/hist", "fanout/outq", "fanout/proxy", "fanout/tenancy", "loop/internal/uring", "proto", "loop/realip"},
	"loop/internal/uring": {},
	"fanout/api":          {"fanout", "fanout/hist", "fanout/tenancy", "fanout/api/httpedge", "persist", "proto"},
	"fanout/tenancy":      {"proto"},
	"fanout/webhook":      {"fanout/hist", "fanout/hooknet", "persist", "proto"},
	"fanout/proxy":        {"fanout/hist", "fanout/hooknet", "proto"},
	"fanout/hooknet":      {"proto"},
	"fanout/outq":         {},
	"fanout":              {"fanout/hist", "fanout/outq", "persist", "pubsub", "proto"},
	"fanout/hist":         {},
	"persist":             {"proto"},
	"persist/pgtest":      {},
	"pubsub":              {"proto"},
	"pubsub/redistest":    {},
	"proto":               {},
	"proto/prototest":     {},
	"tuning":              {},
	"loop/realip":         {},
	"fanout/api/httpedge": {},
	"bench":               {"proto", "pubsub"}, // the broker scenario runs the nodes' own broker
	// Black-box tests run the binary and talk to it over the wire; the
	// harness that builds and runs it serves test/ and bench/.
	"test":         {},
	"test/harness": {"pubsub/redistest"},
}

// never are the edges the design rules out whatever layers says: the wire
// and the shared vocabulary (proto) know no layer above them, and where
// messages live (persist) and how they travel (pubsub) know nothing of the
// publish path (fanout) or the sockets (loop). A publish calls down
// loop -> fanout -> persist/pubsub and comes back only through the
// interfaces fanout registers (pubsub.Handler, fanout.Loop), never
// through an import pointing up.
var never = map[string][]string{
	"proto":   {"loop", "fanout", "persist", "pubsub"},
	"persist": {"fanout", "loop", "pubsub"},
	"pubsub":  {"fanout", "loop", "persist"},
}

// forbidden reports whether dep is an edge never allows from rel (rel or
// any package under it).
func forbidden(rel, dep string) bool {
	for from, deps := range never {
		if rel != from && !strings.HasPrefix(rel, from+"/") {
			continue
		}
		for _, d := range deps {
			if dep == d || strings.HasPrefix(dep, d+"/") {
				return true
			}
		}
	}
	return false
}

// TestLayeringNeverAllowsUpward keeps the layers map itself within never.
func TestLayeringNeverAllowsUpward(t *testing.T) {
	for rel, allowed := range layers {
		for _, dep := range allowed {
			if dep != "*" && forbidden(rel, dep) {
				t.Errorf("layers lets %s import %s, which the design rules out", rel, dep)
			}
		}
	}
}

// TestLayering fails when a package imports what the layering forbids.
func TestLayering(t *testing.T) {
	const module = "github.com/roost-chat/roost"
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		name := d.Name()
		if path != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "docs") {
			return filepath.SkipDir
		}
		pkg, err := build.ImportDir(path, 0)
		if err != nil {
			if _, ok := err.(*build.NoGoError); ok {
				return nil
			}
			return err
		}
		rel := filepath.ToSlash(path)
		allowed, ok := layers[rel]
		if !ok {
			t.Errorf("package %s has no place in the layering: add it to layers in layering_test.go", rel)
			return nil
		}
		for _, imp := range pkg.Imports {
			if !strings.HasPrefix(imp, module+"/") {
				continue
			}
			dep := strings.TrimPrefix(imp, module+"/")
			if forbidden(rel, dep) {
				t.Errorf("%s imports %s: the design rules that edge out", rel, dep)
				continue
			}
			if !slices.Contains(allowed, "*") && !slices.Contains(allowed, dep) {
				t.Errorf("%s imports %s: the layering allows it only %v", rel, dep, allowed)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
