package main

import (
	"runtime"
	"runtime/debug"
	"strings"
)

// A release build names itself; other builds take what the Go toolchain
// stamped into the binary (the module version, and the VCS revision and
// time of the checkout it was built from):
//
//	go build -ldflags "-X main.version=v1.2.0 -X main.revision=$(git rev-parse HEAD)" .
//
// (.ci/release.sh does this.) An -X value wins over the stamped one, so a
// build from a source tarball, which has no VCS information, can still say
// where it came from.
var (
	version   string
	revision  string
	buildTime string
)

// buildVersion is what `roost version` prints and /metrics labels.
type buildVersion struct {
	Version  string // v1.2.0, v0.0.0-20260101120000-abcdef012345+dirty, or (devel)
	Revision string // the VCS revision, "" when unknown
	Time     string // the revision's commit time, RFC 3339
	Modified bool   // built from a checkout with uncommitted changes
}

func init() {
	bi, _ := debug.ReadBuildInfo()
	v := readVersion(bi, version, revision, buildTime)
	// /metrics (roost_node_info) and the logs name the version by this
	// variable.
	version, revision, buildTime = v.Version, v.Revision, v.Time
	binaryVersion = v
}

var binaryVersion buildVersion

// readVersion takes the toolchain's build info (nil: none) and what -X
// gave (empty: nothing).
func readVersion(bi *debug.BuildInfo, ver, rev, at string) buildVersion {
	var v buildVersion
	if bi != nil {
		v.Version = bi.Main.Version
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				v.Revision = s.Value
			case "vcs.time":
				v.Time = s.Value
			case "vcs.modified":
				v.Modified = s.Value == "true"
			}
		}
	}
	if ver != "" {
		v.Version = ver
	}
	if rev != "" {
		// A release names the exact commit: what the toolchain saw of the
		// working tree does not apply to it.
		v.Revision, v.Modified = rev, false
	}
	if at != "" {
		v.Time = at
	}
	if v.Version == "" {
		v.Version = "(devel)"
	}
	return v
}

// String is one line: roost VERSION (revision REV, TIME, modified) GO OS/ARCH.
func (v buildVersion) String() string {
	var b strings.Builder
	b.WriteString("roost ")
	b.WriteString(v.Version)
	var in []string
	if v.Revision != "" {
		in = append(in, "revision "+v.Revision)
	}
	if v.Time != "" {
		in = append(in, v.Time)
	}
	if v.Modified {
		in = append(in, "modified")
	}
	if len(in) > 0 {
		b.WriteString(" (" + strings.Join(in, ", ") + ")")
	}
	b.WriteString(" " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH)
	return b.String()
}
