package main

import (
	"runtime/debug"
	"strings"
	"testing"
)

// roost version reads the module version and the VCS stamp from the build
// info; -X values (a release build) win over them.
func TestVersionFromBuildInfo(t *testing.T) {
	bi := &debug.BuildInfo{
		Main: debug.Module{Path: "github.com/roost-chat/roost", Version: "v0.0.0-20261206041228-9df4fbe10a8b+dirty"},
		Settings: []debug.BuildSetting{
			{Key: "vcs", Value: "git"},
			{Key: "vcs.revision", Value: "9df4fbe10a8bdd1ef248ac295fe7d21abcdab503"},
			{Key: "vcs.time", Value: "2026-12-06T04:12:28Z"},
			{Key: "vcs.modified", Value: "true"},
		},
	}
	v := readVersion(bi, "", "", "")
	got := v.String()
	for _, want := range []string{"roost v0.0.0-20261206041228-9df4fbe10a8b+dirty (", "revision 9df4fbe10a8bdd1ef248ac295fe7d21abcdab503", "2026-12-06T04:12:28Z", "modified)", " go1."} {
		if !strings.Contains(got, want) {
			t.Errorf("version %q lacks %q", got, want)
		}
	}

	rel := readVersion(bi, "v1.2.0", "0123456789abcdef0123456789abcdef01234567", "2026-12-01T00:00:00Z")
	if rel.Version != "v1.2.0" || rel.Revision != "0123456789abcdef0123456789abcdef01234567" || rel.Time != "2026-12-01T00:00:00Z" || rel.Modified {
		t.Fatalf("release override: %+v", rel)
	}
	if got := rel.String(); !strings.HasPrefix(got, "roost v1.2.0 (revision 0123456789abcdef0123456789abcdef01234567, 2026-12-01T00:00:00Z) go") {
		t.Fatalf("release version %q", got)
	}

	// No build info at all (a test binary has some, a stripped one may not).
	if v := readVersion(nil, "", "", ""); v.Version != "(devel)" || !strings.HasPrefix(v.String(), "roost (devel) go") {
		t.Fatalf("no build info: %+v", v)
	}
}
