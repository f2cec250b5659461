// Package atomicfile replaces a file's content so that readers, even after
// a crash or power loss, see the old content or the new, never a mix or an
// empty file.
//
// Write puts the data in a temporary file in the target's directory,
// fsyncs it, renames it over the target and fsyncs the directory. The
// temporary file's name is fixed by a pattern (WithTempPattern), so a
// caller can find and remove what a crash in the middle left behind.
package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Option changes how Write works.
type Option func(*options)

type options struct {
	mode     os.FileMode
	setMode  bool
	validate func(tmpPath string) error
	pattern  string
	noSync   bool
}

// WithMode gives the file the permission bits of mode, whatever the umask.
// Without it the file is created 0600 less the umask, as os.CreateTemp
// does. The old file's mode is never kept: the new file is a new inode.
func WithMode(mode os.FileMode) Option {
	return func(o *options) { o.mode, o.setMode = mode.Perm(), true }
}

// WithValidate has fn check the complete temporary file, already written,
// fsynced and closed with its final mode, before it replaces the target:
// an error from fn leaves the target untouched, and Write returns it
// wrapped. fn must not keep, move or remove tmpPath.
func WithValidate(fn func(tmpPath string) error) Option {
	return func(o *options) { o.validate = fn }
}

// WithoutSync skips the fsync of the file and of the directory.
//
// The write then survives a kill of the process (the page cache holds it),
// not a crash or power loss, after which the file may be empty or hold the
// old content; concurrent readers still never see a partial file. For
// files that are derived state, or that matter only until the node reboots.
// Such a write replaces an existing file by swapping names (see exchange),
// which spares it the data write-out ext4 does on a rename over a file.
func WithoutSync() Option {
	return func(o *options) { o.noSync = true }
}

// WithTempPattern names the temporary file as os.CreateTemp does: pattern,
// with its last "*" replaced by a random string (or the string appended if
// there is no "*"), in the target's directory. It must not contain a path
// separator. The default is "."+filepath.Base(path)+".tmp-*". Callers that
// clean up leftovers match the same pattern, and should make it specific to
// the target so that it matches no other file.
func WithTempPattern(pattern string) Option {
	return func(o *options) { o.pattern = pattern }
}

// Write replaces the file at path with data.
//
// After Write returns nil the file holds data, and still does after a crash
// (unless WithoutSync: then after a kill only). On any error the old file, if any, is untouched and
// no temporary file is left, except when only the final directory fsync
// failed: the new content is then in place but may not survive a power
// loss. Errors name path. The directory must exist.
//
// Concurrent Writes to one path leave one writer's data, whole.
func Write(path string, data []byte, opts ...Option) (err error) {
	o := options{}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	base := filepath.Base(path)
	if path == "" || os.IsPathSeparator(path[len(path)-1]) || base == "." || base == ".." {
		return fmt.Errorf("write %q: not a file path", path)
	}
	pattern := o.pattern
	if pattern == "" {
		pattern = "." + base + ".tmp-*"
	}
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, pattern)
	if err != nil {
		return fmt.Errorf("write %s: creating the temp file: %w", path, err)
	}
	tmp := f.Name()
	renamed := false
	defer func() {
		if err != nil && !renamed {
			_ = f.Close() // a second Close only errors
			_ = os.Remove(tmp)
		}
	}()
	if _, err = f.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if o.setMode {
		if err = f.Chmod(o.mode); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
	}
	if !o.noSync {
		if err = f.Sync(); err != nil {
			return fmt.Errorf("write %s: fsync of %s: %w", path, tmp, err)
		}
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if o.validate != nil {
		if err = o.validate(tmp); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
	}
	if o.noSync {
		renamed = exchange(tmp, path)
	}
	if !renamed {
		if err = os.Rename(tmp, path); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
		renamed = true
	}
	if !o.noSync {
		if err = SyncDir(dir); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
	}
	return nil
}

// exchange puts the unsynced temp file tmp in place of the regular file
// at path by swapping the two names (renameat2 RENAME_EXCHANGE), then
// removes the old file, now under tmp's name. A rename over an existing
// file would do the same in one call, but ext4 (auto_da_alloc) then writes
// the new file's data out before returning, about 0.2 ms per write on this
// project's CI disk, which is the durability WithoutSync declines; the
// swap is as atomic for readers and costs no I/O. A kill between the swap
// and the removal (or a failed removal) leaves the old content under the
// temp name, which the caller's sweep of its temp pattern removes. It
// returns false, having changed nothing, when path is not a regular file
// or the filesystem cannot swap (the caller then renames).
func exchange(tmp, path string) bool {
	if fi, err := os.Lstat(path); err != nil || !fi.Mode().IsRegular() {
		return false
	}
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, path, unix.RENAME_EXCHANGE); err != nil {
		return false
	}
	_ = os.Remove(tmp) // the new content is in place either way
	return true
}

// SyncDir fsyncs the directory dir, which makes a rename, creation or
// removal in it durable. Filesystems that cannot fsync a directory (EINVAL,
// ENOTSUP) count as success: their renames are as durable as they get.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("fsync of directory: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOTSUP) {
		return fmt.Errorf("fsync of directory %s: %w", dir, err)
	}
	return nil
}

// RemoveStale removes the regular files in dir whose names match (the
// temporary files of Writes, named by WithTempPattern) and that were last
// modified before olderThan: what a write killed between creating its
// temporary file and renaming it leaves behind. Younger files are spared:
// another process may be writing them now. It returns the names it
// removed, in directory order; a missing dir has nothing to remove.
func RemoveStale(dir string, match func(name string) bool, olderThan time.Time) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("removing stale temporary files: %w", err)
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		if !e.Type().IsRegular() || !match(e.Name()) {
			continue
		}
		fi, err := e.Info()
		if err != nil || !fi.ModTime().Before(olderThan) {
			continue // gone already, or young
		}
		p := filepath.Join(dir, e.Name())
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("removing stale temporary file %s: %w", p, err))
			continue
		}
		removed = append(removed, e.Name())
	}
	return removed, errors.Join(errs...)
}
