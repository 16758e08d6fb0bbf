// Package atomicfile writes a file whole or not at all: into a temporary
// file beside it, synced, then renamed over it. A reader sees the old
// content or all of the new, and a failed write leaves nothing behind.
package atomicfile

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Write copies r into path with the permission bits perm (exactly: the
// caller applies a umask if it wants one) and returns how many bytes it
// wrote. Nothing is at path until all of r is read and on disk.
func Write(path string, r io.Reader, perm fs.FileMode) (int64, error) {
	return write(path, r, perm, true)
}

// WriteBytesUnsynced writes b to path whole or not at all, as WriteBytes
// does, without syncing it first: a reader, and this process killed at
// any instant, still see the old content or all of the new, but the host
// losing power may leave it empty. For what does not outlive the host
// anyway (an exec's pid, offsets and exit code: its sandbox does not
// survive a reboot), where a sync was most of the write's time.
func WriteBytesUnsynced(path string, b []byte, perm fs.FileMode) error {
	_, err := write(path, strings.NewReader(string(b)), perm, false)
	return err
}

// tempPrefix begins the name of a temporary file of one named base.
func tempPrefix(base string) string { return "." + base + ".sbx-" }

// IsTempOf reports whether name is that of a temporary file a write of a
// file named base makes beside it (left behind when its directory moved
// away under it, or by a process killed mid-write).
func IsTempOf(name, base string) bool {
	return strings.HasPrefix(name, tempPrefix(base)) && len(name) > len(tempPrefix(base))
}

func write(path string, r io.Reader, perm fs.FileMode, sync bool) (int64, error) {
	f, err := os.CreateTemp(filepath.Dir(path), tempPrefix(filepath.Base(path))+"*")
	if err != nil {
		return 0, fmt.Errorf("write %s: %w", path, err)
	}
	n, err := io.Copy(f, r)
	if err == nil && perm.Perm() != 0o600 { // CreateTemp's own
		err = f.Chmod(perm.Perm())
	}
	if err == nil && sync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		return 0, fmt.Errorf("write %s: %w", path, err)
	}
	return n, nil
}

// WriteBytes writes b to path as Write does.
func WriteBytes(path string, b []byte, perm fs.FileMode) error {
	_, err := Write(path, strings.NewReader(string(b)), perm)
	return err
}

// WriteString writes s to path as Write does.
func WriteString(path, s string, perm fs.FileMode) error {
	_, err := Write(path, strings.NewReader(s), perm)
	return err
}
