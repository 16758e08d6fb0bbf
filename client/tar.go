package client

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"sbx.dev/sbx/internal/atomicfile"
	"sbx.dev/sbx/internal/safetar"
)

// extractTar extracts the tar r, what comes out of a sandbox, into the
// directory dest, dropping the first component of every name. A sandbox
// may be hostile: nothing it sends is written outside dest, through a
// symlink, over a directory, or with more than permission bits within the
// umask (no setuid, no owner, no times); devices and fifos are skipped,
// and an archive cut short is refused. The tar's root entry sets dest's
// mode only when fresh (dest was made for this extraction): an existing
// folder keeps its mode.
func extractTar(r io.Reader, dest string, fresh bool) error {
	_, err := safetar.Extract(r, dest, safetar.Options{
		StripComponents: 1,
		RootMode:        fresh,
		RequireEnd:      true,
		Umask:           processUmask(),
		SkipUnknown:     true,
	})
	var te *safetar.Error
	if err != nil && !errors.As(err, &te) {
		return fmt.Errorf("read tar: %w", err) // the stream's own
	}
	return err
}

// extractInto extracts a tar whose entries start with one base name into
// the directory target: into it when it exists, else into a temporary
// directory renamed to target once the tar is whole.
func extractInto(r io.Reader, target string) error {
	if fi, err := os.Lstat(target); err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("cannot copy a directory onto %s, which is not a directory", target)
		}
		return extractTar(r, target, false)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(target), "."+filepath.Base(target)+".sbx-*")
	if err != nil {
		return err
	}
	if err := extractTar(r, tmp, true); err != nil {
		os.RemoveAll(tmp)
		return fmt.Errorf("copy to %s: %w", target, err)
	}
	if err := os.Rename(tmp, target); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	return nil
}

// writeFileAtomic writes r to a temporary file next to target and renames
// it into place once all of r is read: a failed read leaves no file
// behind. The file gets perm within the umask.
func writeFileAtomic(target string, r io.Reader, perm fs.FileMode) (int64, error) {
	n, err := atomicfile.Write(target, r, perm.Perm()&^processUmask())
	if err != nil {
		return 0, fmt.Errorf("copy to %s: %w", target, err)
	}
	return n, nil
}

// parseMode reads a FileInfo mode, octal ("0644", "100755") or as ls shows it
// ("-rwxr-xr-x"), and returns its permission bits.
func parseMode(s string) (fs.FileMode, bool) {
	if n, err := strconv.ParseUint(s, 8, 32); err == nil {
		return fs.FileMode(n).Perm(), true
	}
	if len(s) < 9 {
		return 0, false
	}
	rwx := s[len(s)-9:]
	var m fs.FileMode
	for i, ch := range rwx {
		want := "rwxrwxrwx"[i]
		switch {
		case byte(ch) == want, want == 'x' && (ch == 's' || ch == 't'):
			m |= 1 << (8 - i)
		case ch == '-', want == 'x' && (ch == 'S' || ch == 'T'):
		default:
			return 0, false
		}
	}
	return m, true
}

// processUmask is the process's umask, read from /proc (setting it to
// read it would race with other goroutines making files); 022 if unknown.
func processUmask() fs.FileMode {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0o022
	}
	defer f.Close()
	sc := bufio.NewScanner(io.LimitReader(f, 64<<10))
	for sc.Scan() {
		if v, ok := bytes.CutPrefix(sc.Bytes(), []byte("Umask:")); ok {
			if n, err := strconv.ParseUint(strings.TrimSpace(string(v)), 8, 32); err == nil {
				return fs.FileMode(n) & 0o777
			}
		}
	}
	return 0o022
}
