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
// the test until it is given its place.
var layers = map[string][]string{
	".":                {"*"}, // main wires everything
	"loop":             {"fanout", "fanout/proxy", "proto"},
	"fanout/api":       {"fanout", "persist", "proto"},
	"fanout/webhook":   {"persist", "proto"},
	"fanout/proxy":     {"proto"},
	"fanout":           {"persist", "pubsub", "proto"},
	"persist":          {"proto"},
	"persist/pgtest":   {},
	"pubsub":           {"proto"},
	"pubsub/redistest": {},
	"proto":            {},
	"proto/prototest":  {},
	"tuning":           {},
	"bench":            {"proto", "pubsub"}, // the broker scenario runs the nodes' own broker
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
