package persist

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/roost-chat/roost/proto"
)

// A registry path whose directories do not exist yet (the README's
// /var/lib/roost/apps.json on a fresh machine) works: the first write makes
// them, readable by their owner only.
func TestAppFileMakesItsDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "var", "lib", "roost")
	f := OpenAppFile(filepath.Join(dir, "apps.json"))
	if apps, err := f.Apps(context.Background()); err != nil || len(apps) != 0 {
		t.Fatalf("missing file: %v %v", apps, err)
	}
	if err := f.CreateApp(context.Background(), proto.App{ID: "chat", Secret: "0123456789abcdef0123456789abcdef"}); err != nil {
		t.Fatal(err)
	}
	apps, err := f.Apps(context.Background())
	if err != nil || len(apps) != 1 || apps[0].ID != "chat" {
		t.Fatalf("after create: %v %v", apps, err)
	}
	fi, err := os.Stat(dir)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("directory: %v %v", fi.Mode(), err)
	}
}
