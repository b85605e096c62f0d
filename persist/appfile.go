package persist

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"time"

	"github.com/roost-chat/roost/proto"
)

// AppFile is the app registry of a node without a database: one JSON file,
// {"apps":[APP,...]}, holding secrets (so it is written mode 0600). Writers
// (the `roost app` commands) take an flock on FILE.lock, write a temporary
// file and rename it over the old one, so a node never reads half a file;
// nodes notice the new file by its mtime or on SIGHUP (Reload).
type AppFile struct {
	path   string
	reload chan struct{}
}

// OpenAppFile returns the registry kept in path. The file need not exist
// yet: a missing file is an empty registry until `roost app create`.
func OpenAppFile(path string) *AppFile {
	return &AppFile{path: path, reload: make(chan struct{}, 1)}
}

type appFileBody struct {
	Apps []proto.App `json:"apps"`
}

// Path is the file's name.
func (f *AppFile) Path() string { return f.path }

// Apps reads the file and checks every entry.
func (f *AppFile) Apps(context.Context) ([]proto.App, error) {
	b, err := os.ReadFile(f.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cannot read the app registry: %w", err)
	}
	return parseAppFile(f.path, b)
}

func parseAppFile(path string, b []byte) ([]proto.App, error) {
	var body appFileBody
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		return nil, fmt.Errorf("cannot parse the app registry %s: %w", path, err)
	}
	seen := make(map[string]bool, len(body.Apps))
	for i := range body.Apps {
		a := &body.Apps[i]
		if err := a.Validate(); err != nil {
			return nil, fmt.Errorf("bad entry in the app registry %s: %w", path, err)
		}
		if seen[a.ID] {
			return nil, fmt.Errorf("bad app registry %s: app %s appears twice", path, a.ID)
		}
		seen[a.ID] = true
	}
	sort.Slice(body.Apps, func(i, j int) bool { return body.Apps[i].ID < body.Apps[j].ID })
	return body.Apps, nil
}

// edit runs fn on the registry under the file lock and writes the result.
func (f *AppFile) edit(fn func([]proto.App) ([]proto.App, error)) error {
	// The first `roost app create` on a fresh machine makes the directory
	// (e.g. /var/lib/roost); only its owner may list it: it holds secrets.
	if err := os.MkdirAll(filepath.Dir(f.path), 0o700); err != nil {
		return fmt.Errorf("cannot make the app registry's directory: %w", err)
	}
	lock, err := os.OpenFile(f.path+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("cannot lock the app registry: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("cannot lock the app registry: %w", err)
	}
	apps, err := f.Apps(context.Background())
	if err != nil {
		return err
	}
	apps, err = fn(apps)
	if err != nil {
		return err
	}
	sort.Slice(apps, func(i, j int) bool { return apps[i].ID < apps[j].ID })
	b, err := json.MarshalIndent(appFileBody{Apps: apps}, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	tmp, err := os.CreateTemp(filepath.Dir(f.path), filepath.Base(f.path)+".tmp*")
	if err != nil {
		return fmt.Errorf("cannot write the app registry: %w", err)
	}
	defer os.Remove(tmp.Name()) // fails harmlessly after the rename
	// Run as root for a node running as its own user, the new file keeps
	// the old one's owner (or, for a first file, its directory's): the node
	// must still be able to read it.
	if os.Geteuid() == 0 {
		owner := f.path
		if _, err := os.Stat(owner); err != nil {
			owner = filepath.Dir(f.path)
		}
		if fi, err := os.Stat(owner); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				_ = tmp.Chown(int(st.Uid), int(st.Gid))
			}
		}
	}
	if err := tmp.Chmod(0o600); err == nil {
		_, err = tmp.Write(b)
		if err == nil {
			err = tmp.Sync()
		}
		if cerr := tmp.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(tmp.Name(), f.path)
		}
		if err != nil {
			return fmt.Errorf("cannot write the app registry: %w", err)
		}
	} else {
		tmp.Close()
		return fmt.Errorf("cannot write the app registry: %w", err)
	}
	return nil
}

// CreateApp adds a to the file.
func (f *AppFile) CreateApp(_ context.Context, a proto.App) error {
	if err := a.Validate(); err != nil {
		return err
	}
	if a.Created.IsZero() {
		a.Created = time.Now().UTC().Truncate(time.Second)
	}
	return f.edit(func(apps []proto.App) ([]proto.App, error) {
		for _, b := range apps {
			if b.ID == a.ID {
				return nil, fmt.Errorf("cannot create app %s: %w", a.ID, ErrAppExists)
			}
		}
		return append(apps, a), nil
	})
}

// UpdateApp edits one app of the file.
func (f *AppFile) UpdateApp(_ context.Context, id string, fn func(*proto.App) error) (proto.App, error) {
	var out proto.App
	err := f.edit(func(apps []proto.App) ([]proto.App, error) {
		for i := range apps {
			if apps[i].ID != id {
				continue
			}
			a := apps[i]
			if err := fn(&a); err != nil {
				return nil, err
			}
			a.ID = id
			if err := a.Validate(); err != nil {
				return nil, err
			}
			apps[i], out = a, a
			return apps, nil
		}
		return nil, fmt.Errorf("cannot update app %s: %w", id, ErrNoApp)
	})
	return out, err
}

// WatchApps re-reads the file when its mtime, size or inode changes (the
// rename of a writer changes the inode even within one mtime tick), on
// Reload, and every interval.
func (f *AppFile) WatchApps(ctx context.Context, every time.Duration, fn func([]proto.App), log *slog.Logger) {
	check := min(every, 500*time.Millisecond)
	go func() {
		t := time.NewTicker(check)
		defer t.Stop()
		var last fileStamp
		var lastRead time.Time
		var failing bool
		for {
			force := false
			select {
			case <-ctx.Done():
				return
			case <-f.reload:
				force = true
			case <-t.C:
			}
			st := stampOf(f.path)
			if !force && st == last && time.Since(lastRead) < every {
				continue
			}
			last, lastRead = st, time.Now()
			apps, err := f.Apps(ctx)
			if err != nil {
				if !failing {
					log.Warn("cannot read the app registry; keeping the last one", "file", f.path, "err", err)
				}
				failing = true
				continue
			}
			if failing || force {
				log.Info("app registry read", "file", f.path, "apps", len(apps))
			}
			failing = false
			fn(apps)
		}
	}()
}

// Reload makes WatchApps re-read the file now.
func (f *AppFile) Reload() {
	select {
	case f.reload <- struct{}{}:
	default:
	}
}

type fileStamp struct {
	mtime int64
	size  int64
	ino   uint64
}

func stampOf(path string) fileStamp {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}
	}
	st := fileStamp{mtime: fi.ModTime().UnixNano(), size: fi.Size()}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.ino = sys.Ino
	}
	return st
}
