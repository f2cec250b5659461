package checkpoint

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rdma-dra/rdma-dra-driver/internal/atomicfile"
)

// Store reads and writes one checkpoint file. It is safe for concurrent use,
// and for sharing the file with a Store in another process: during a
// rolling update two daemons serve the same node and the kubelet may call
// either. Saves and Updates hold an flock on the file's directory (no lock
// file to leave behind), and every use
// stats the file and reads it again only if another writer replaced it, so
// the prepare path costs a stat and one write, and no read.
type Store struct {
	path  string
	fsync bool
	now   func() time.Time // names quarantined files; tests set it

	mu     sync.Mutex
	loaded bool       // cur mirrors the file as identified by id
	id     fileID     // of the file cur was read from or written to
	cur    Checkpoint // owned by the Store: handed out only as clones
	onDisk []byte     // the file's data bytes if they are known to be current
	lock   *os.File   // the file's directory, opened on first write
}

// fileID tells one version of the file from another: every Save renames a
// new inode into place.
type fileID struct {
	exists      bool
	dev, ino    uint64
	size, mtime int64
}

func statID(path string) (fileID, error) {
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return fileID{}, nil
	}
	if err != nil {
		return fileID{}, fmt.Errorf("checking the checkpoint: %w", err)
	}
	id := fileID{exists: true, size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		id.dev, id.ino = uint64(st.Dev), st.Ino
	}
	return id, nil
}

// Option changes how a Store works.
type Option func(*Store)

// BootScoped declares that what the Store records is valid only during the
// boot that wrote it, and so lets the Store skip the fsyncs of the file and
// of its directory (in Save, Update and Quarantine).
//
// What it skips: durability across a crash or power loss of the node. Every
// write is still atomic (a temp file renamed over the file), and a write that
// returned is in the page cache, so it survives a kill of the process and is
// what the next Load sees, in this process or another. A crash or power loss
// may instead leave the file older than the last write, empty or truncated;
// Load then reports an unreadable file as corrupt (ErrCorrupt), and the
// checksum keeps a partly written one from loading as valid.
//
// Why that is safe only for state that a reboot discards: a crash or power
// loss is a reboot, so what the lost writes held is what the next boot throws
// away anyway. The driver records every claim with the node's boot ID
// (Claim.BootID) and discards an earlier boot's claims at start, so nothing
// such a loss can take would have been used. The daemon always knows its
// boot ID; a caller without one, or with state that must outlive a reboot,
// keeps the default.
//
// What a caller may rely on: within one boot, the same as the default (the
// file holds the last Save or Update that returned, also after a kill of the
// writer). After a reboot, nothing about the earlier boot's writes: the file
// may hold any earlier version, none, or unreadable bytes (ErrCorrupt), but
// never a mix of two versions that loads as valid.
func BootScoped() Option {
	return func(s *Store) { s.fsync = false }
}

// NewStore returns a Store for the checkpoint file at path, such as
// /var/lib/kubelet/plugins/rdma.dra.dev/checkpoint.json. It touches nothing
// on disk. The directory must exist before the first Save, which does not
// create it: a missing directory means a wrong path, better reported than
// papered over.
func NewStore(path string, opts ...Option) *Store {
	s := &Store{path: path, fsync: true, now: time.Now}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Path is the checkpoint file's path.
func (s *Store) Path() string { return s.path }

// Load returns the checkpoint. A missing file is an empty checkpoint. The
// file is read again only when another writer replaced it since this
// Store last read or wrote it; otherwise the Store's copy is returned. The result is the caller's own, with a non-nil Claims
// map: changing it changes nothing in the Store.
//
// An unreadable file gives an error wrapping ErrCorrupt; a file of a newer
// format version gives an error that does not (see the package doc).
func (s *Store) Load() (Checkpoint, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.loadLocked(); err != nil {
		return Checkpoint{}, err
	}
	return s.cur.clone(), nil
}

func (s *Store) loadLocked() error {
	id, err := statID(s.path)
	if err != nil {
		return err
	}
	if s.loaded && id == s.id {
		return nil
	}
	b, err := os.ReadFile(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		s.cur, s.onDisk, s.id, s.loaded = Checkpoint{Claims: map[string]Claim{}}, nil, fileID{}, true
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading the checkpoint: %w", err)
	}
	cp, data, err := decodeFile(s.path, b)
	if err != nil {
		return err
	}
	// The id read before the file: if it was replaced in between, the next
	// use reads it again.
	s.cur, s.onDisk, s.id, s.loaded = cp, data, id, true
	return nil
}

// lockFile takes the cross-process write lock; the caller holds s.mu and
// calls the returned unlock.
func (s *Store) lockFile() (func(), error) {
	if s.lock == nil {
		f, err := os.Open(filepath.Dir(s.path))
		if err != nil {
			return nil, fmt.Errorf("locking the checkpoint %s: %w", s.path, err)
		}
		s.lock = f
	}
	for {
		err := syscall.Flock(int(s.lock.Fd()), syscall.LOCK_EX)
		if err == nil {
			break
		}
		if err != syscall.EINTR {
			return nil, fmt.Errorf("locking the checkpoint's directory %s: %w", filepath.Dir(s.path), err)
		}
	}
	return func() { _ = syscall.Flock(int(s.lock.Fd()), syscall.LOCK_UN) }, nil
}

// RemoveStaleTemps removes the temp files of Saves and Updates killed
// before their rename, and returns their names. It holds the file lock, as
// every write does while its temp file exists, so each temp it finds is a
// killed write's, whatever its age: olderThan (the common shape of the
// driver's sweeps) is not needed here. Another daemon's write in progress
// finishes first.
func (s *Store) RemoveStaleTemps(olderThan time.Time) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := os.Stat(filepath.Dir(s.path)); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	unlock, err := s.lockFile()
	if err != nil {
		return nil, err
	}
	defer unlock()
	pattern := tempName(s.path)
	return atomicfile.RemoveStale(filepath.Dir(s.path), func(name string) bool {
		ok, _ := filepath.Match(pattern, name)
		return ok
	}, time.Now().Add(time.Hour))
}

// tempName is the name pattern of Save's temp files for the checkpoint at
// path (see atomicfile.WithTempPattern), hidden and specific to this file
// so nothing else in the directory matches.
func tempName(path string) string {
	return "." + filepath.Base(path) + ".tmp-*"
}

// Save replaces the file with cp, atomically: a reader, even after a crash,
// finds the old or the new checkpoint, never a mix. It writes a temp file
// in the same directory, fsyncs it, renames it over the file and fsyncs the
// directory so the rename survives a power loss. On error the old file is
// untouched (unless only the directory fsync failed) and no temp file is
// left. Save keeps no reference to cp. With BootScoped both fsyncs are
// skipped: see there for what a crash may then leave.
func (s *Store) Save(cp Checkpoint) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	unlock, err := s.lockFile()
	if err != nil {
		return err
	}
	defer unlock()
	return s.saveLocked(cp.clone(), false)
}

// saveLocked writes cp, which it takes ownership of. With unlessSame, it
// skips the write when the data is what the file already holds.
func (s *Store) saveLocked(cp Checkpoint, unlessSame bool) error {
	if err := cp.normalize(); err != nil {
		return fmt.Errorf("saving the checkpoint %s: %w", s.path, err)
	}
	data, err := encodeData(cp)
	if err != nil {
		return fmt.Errorf("saving the checkpoint %s: %w", s.path, err)
	}
	if unlessSame && s.loaded && s.onDisk != nil && bytes.Equal(data, s.onDisk) {
		s.cur = cp
		return nil
	}
	forget := func() { s.loaded, s.cur, s.onDisk, s.id = false, Checkpoint{}, nil, fileID{} }
	if err := s.writeFile(encodeFile(data)); err != nil {
		// Whether the file changed is not certain: read it again next time.
		forget()
		return err
	}
	// Under the file lock nobody else renames in between.
	id, err := statID(s.path)
	if err != nil {
		forget()
		return nil // saved; the next use reads it back
	}
	s.cur, s.onDisk, s.id, s.loaded = cp, data, id, true
	return nil
}

func (s *Store) writeFile(b []byte) error {
	opts := []atomicfile.Option{atomicfile.WithTempPattern(tempName(s.path))}
	if !s.fsync {
		opts = append(opts, atomicfile.WithoutSync())
	}
	if err := atomicfile.Write(s.path, b, opts...); err != nil {
		return fmt.Errorf("saving the checkpoint: %w", err)
	}
	return nil
}

// Update applies fn to the checkpoint and saves the result, as one step
// under the Store's lock and the file lock, so concurrent Updates, in this
// process or another, never lose each other's changes. fn works on a copy: if it
// returns an error, or the save fails, nothing changes, and the error is
// returned as is. fn must not keep cp after it returns. Nothing is written
// when fn leaves the checkpoint as the file has it.
func (s *Store) Update(fn func(cp *Checkpoint) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	unlock, err := s.lockFile()
	if err != nil {
		return err
	}
	defer unlock()
	if err := s.loadLocked(); err != nil {
		return err
	}
	cp := s.cur.clone()
	if err := fn(&cp); err != nil {
		return err
	}
	return s.saveLocked(cp, true)
}

// Quarantine renames the checkpoint file aside to <path>.corrupt-<UTC time>
// for a human to inspect, and returns the new path. It never deletes or
// overwrites a file: if the name is taken, a counter is appended. After it,
// the Store holds an empty checkpoint.
func (s *Store) Quarantine() (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	base := s.path + ".corrupt-" + s.now().UTC().Format("20060102T150405Z")
	target := base
	for i := 1; ; i++ {
		_, err := os.Lstat(target)
		if errors.Is(err, fs.ErrNotExist) {
			break
		}
		if err != nil {
			return "", fmt.Errorf("moving the checkpoint aside: %w", err)
		}
		if i > 1000 {
			return "", fmt.Errorf("moving the checkpoint aside: %s.1 to .1000 all exist", base)
		}
		target = fmt.Sprintf("%s.%d", base, i)
	}
	if err := os.Rename(s.path, target); err != nil {
		return "", fmt.Errorf("moving the checkpoint aside: %w", err)
	}
	s.cur, s.onDisk, s.id, s.loaded = Checkpoint{Claims: map[string]Claim{}}, nil, fileID{}, true
	if s.fsync {
		if err := atomicfile.SyncDir(filepath.Dir(s.path)); err != nil {
			return target, fmt.Errorf("moved the checkpoint aside to %s, but: %w", target, err)
		}
	}
	return target, nil
}

// bootIDPath is where Linux publishes the boot ID.
const bootIDPath = "/proc/sys/kernel/random/boot_id"

// BootID returns the kernel's boot ID, a UUID that changes on every boot.
func BootID() (string, error) { return BootIDFrom(bootIDPath) }

// BootIDFrom reads a boot ID from path, for tests and for hosts whose /proc
// is mounted elsewhere.
func BootIDFrom(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("reading the boot ID: %w", err)
	}
	id := strings.TrimSpace(string(b))
	if !isUUID(id) {
		return "", fmt.Errorf("%s: %q is not a boot ID; want a UUID such as 5b1f0a3c-8f0e-4c55-9d8e-0c1f2a3b4c5d", path, shortened(id))
	}
	return id, nil
}

// statPath is where Linux publishes the time it booted (the btime line).
const statPath = "/proc/stat"

// BootTime returns when the node booted: the kernel's btime, in whole
// seconds rounded down. A file written during this boot is not older than
// it, unless the clock was set forward since (a node whose clock was wrong
// when it booted); the driver compares an unreadable checkpoint's mtime with
// it to tell what a power loss left of an earlier boot's file (see
// BootScoped).
func BootTime() (time.Time, error) { return BootTimeFrom(statPath) }

// BootTimeFrom reads the boot time from a file in the format of /proc/stat,
// for tests and for hosts whose /proc is mounted elsewhere.
func BootTimeFrom(path string) (time.Time, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return time.Time{}, fmt.Errorf("reading the boot time: %w", err)
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "btime" {
			continue
		}
		if len(f) == 2 {
			if sec, err := strconv.ParseInt(f[1], 10, 64); err == nil && sec > 0 {
				return time.Unix(sec, 0), nil
			}
		}
		return time.Time{}, fmt.Errorf("%s: %q is not a boot time; want btime and seconds since 1970, such as btime 1782900000", path, shortened(strings.TrimSpace(line)))
	}
	return time.Time{}, fmt.Errorf("%s: no btime line, so no boot time", path)
}

func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i, r := range s {
		switch i {
		case 8, 13, 18, 23:
			if r != '-' {
				return false
			}
		default:
			if !strings.ContainsRune("0123456789abcdefABCDEF", r) {
				return false
			}
		}
	}
	return true
}

func shortened(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
