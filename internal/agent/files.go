package agent

import (
	"cmp"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"
)

// runGet writes the bytes of a file, or with --tar a tar of a file or
// directory, to stdout.
func runGet(args []string, stdout io.Writer) error {
	const syntax = "get [--tar] [--user U] PATH"
	fset := flag.NewFlagSet("get", flag.ContinueOnError)
	asTar := fset.Bool("tar", false, "write a tar of PATH")
	user := userFlag(fset)
	pos, err := parseFlags(fset, args, 1, syntax)
	if err != nil {
		return err
	}
	path, err := resolvePath(pos[0], *user)
	if err != nil {
		return err
	}
	if *asTar {
		return writeTar(path, stdout)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return pathError(path, err)
	}
	if fi.IsDir() {
		return invalidf("%s is a directory: read it as a tar (the API's ?tar=1, sbx scp -r)", path)
	}
	if !fi.Mode().IsRegular() {
		// opening a FIFO would block, a device may never end
		return invalidf("%s is not a regular file (%s)", path, fi.Mode().Type())
	}
	f, err := os.Open(path)
	if err != nil {
		return pathError(path, err)
	}
	defer f.Close()
	if _, err := io.Copy(stdout, f); err != nil {
		return failf(ExitError, "read %s: %s", path, errText(err))
	}
	return nil
}

// runPut replaces a file with exactly --size bytes read from stdin, through a
// synced temporary file renamed over it, so the file is whole or untouched.
func runPut(args []string, stdin io.Reader) error {
	const syntax = "put --size N [--mode 0644] [--user U] PATH"
	fset := flag.NewFlagSet("put", flag.ContinueOnError)
	size := fset.Int64("size", -1, "number of bytes to read from stdin")
	modeFlag := fset.String("mode", "", "permission bits, octal (default: the old file's, or 0644)")
	user := userFlag(fset)
	pos, err := parseFlags(fset, args, 1, syntax)
	if err != nil {
		return err
	}
	if *size < 0 {
		return invalidf("put: --size N is required; usage: sbx-agent %s", syntax)
	}
	mode := uint32(0o644)
	keepMode := *modeFlag == ""
	if !keepMode {
		m, err := strconv.ParseUint(*modeFlag, 8, 32)
		if err != nil || m > 0o7777 {
			return invalidf("put: bad --mode %q; give octal permission bits like 0644", *modeFlag)
		}
		mode = uint32(m)
	}
	path, err := resolvePath(pos[0], *user)
	if err != nil {
		return err
	}
	// a symlink is written through, as `cat > link` would
	if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real
	}
	dir := filepath.Dir(path)
	if err := requireDir(dir); err != nil {
		return err
	}
	// a new file belongs to the user the request names; a replaced one
	// keeps its owner
	uid, gid := -1, -1
	if *user != "" {
		if u, err := lookupUser(*user); err == nil {
			uid, gid = u.uid, u.gid
		}
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.IsDir() {
			return invalidf("%s is a directory", path)
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			uid, gid = int(st.Uid), int(st.Gid)
			if keepMode {
				mode = st.Mode & 0o7777
			}
		}
	}

	tmp := tempName(path)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return pathError(dir, err)
	}
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	n, err := io.CopyN(f, stdin, *size)
	if err != nil {
		if errors.Is(err, io.EOF) {
			return failf(ExitError, "put %s: input ended after %d of %d bytes; the file was not changed", path, n, *size)
		}
		return failf(ExitError, "put %s: %s; the file was not changed", path, errText(err))
	}
	if uid >= 0 {
		// keep the owner of the file being replaced; before chmod, which
		// chown would clear setuid bits after
		if err := f.Chown(uid, gid); err != nil && os.Geteuid() == 0 {
			return failf(ExitError, "put %s: chown: %s", path, errText(err))
		}
	}
	if err := syscall.Fchmod(int(f.Fd()), mode); err != nil {
		return failf(ExitError, "put %s: chmod: %s", path, errText(err))
	}
	if err := f.Sync(); err != nil {
		return failf(ExitError, "put %s: sync: %s", path, errText(err))
	}
	if err := f.Close(); err != nil {
		return failf(ExitError, "put %s: %s", path, errText(err))
	}
	if err := os.Rename(tmp, path); err != nil {
		return pathError(path, err)
	}
	ok = true
	syncDir(dir)
	return nil
}

// requireDir checks that dir exists and is a directory.
func requireDir(dir string) error {
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return failf(ExitNotFound, "directory %s does not exist", dir)
	case err != nil:
		return pathError(dir, err)
	case !fi.IsDir():
		return invalidf("%s is not a directory", dir)
	}
	return nil
}

// syncDir makes a rename in dir durable; best effort.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}

// runStat writes the apiFileInfo of a path (not following a final symlink).
func runStat(args []string, stdout io.Writer) error {
	fset := flag.NewFlagSet("stat", flag.ContinueOnError)
	user := userFlag(fset)
	pos, err := parseFlags(fset, args, 1, "stat [--user U] PATH")
	if err != nil {
		return err
	}
	path, err := resolvePath(pos[0], *user)
	if err != nil {
		return err
	}
	info, err := fileInfo(path)
	if err != nil {
		return pathError(path, err)
	}
	return writeJSON(stdout, info)
}

// runLs writes the apiFileInfo of each entry of a directory, sorted by name:
// with --after, only the names after that one; with --limit, at most that
// many (a page: the caller asks again after the last name it got).
func runLs(args []string, stdout io.Writer) error {
	fset := flag.NewFlagSet("ls", flag.ContinueOnError)
	user := userFlag(fset)
	after := fset.String("after", "", "list only the names after this one")
	afterHex := fset.String("after-hex", "", "--after, in hex (a name's bytes reach the agent whole, whatever carries the arguments)")
	limit := fset.Int("limit", 0, "list at most this many entries (0: all)")
	pos, err := parseFlags(fset, args, 1, "ls [--user U] [--after NAME] [--limit N] PATH")
	if err != nil {
		return err
	}
	path, err := resolvePath(pos[0], *user)
	if err != nil {
		return err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return pathError(path, err)
	}
	if !fi.IsDir() {
		return invalidf("%s is not a directory", path)
	}
	ents, err := os.ReadDir(path) // sorted by name
	if err != nil {
		return pathError(path, err)
	}
	if *afterHex != "" {
		b, err := hex.DecodeString(*afterHex)
		if err != nil {
			return invalidf("--after-hex %q: not hex", *afterHex)
		}
		*after = string(b)
	}
	if *after != "" {
		i, _ := slices.BinarySearchFunc(ents, *after, func(e fs.DirEntry, name string) int { return strings.Compare(e.Name(), name) })
		for i < len(ents) && ents[i].Name() == *after {
			i++
		}
		ents = ents[i:]
	}
	n := len(ents)
	if *limit > 0 {
		n = min(n, *limit)
	}
	infos := make([]apiFileInfo, 0, n)
	for _, e := range ents {
		if *limit > 0 && len(infos) == *limit {
			break
		}
		info, err := fileInfo(filepath.Join(path, e.Name()))
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed since the listing
		}
		if err != nil {
			return pathError(filepath.Join(path, e.Name()), err)
		}
		infos = append(infos, info)
	}
	return writeJSON(stdout, infos)
}

// userFlag adds --user to a file subcommand: whose home ~ is.
func userFlag(fset *flag.FlagSet) *string {
	return fset.String("user", "", "the user the request is for: a name or uid[:gid] (default root); ~ is their home")
}

// resolvePath returns p as an absolute, clean path: "~" and "~/..." start
// at the home of user (a name or uid[:gid]; "" is root), "~name/..." at
// name's, both from the sandbox's own /etc/passwd. Any other path must be
// absolute.
func resolvePath(p, user string) (string, error) {
	if !strings.HasPrefix(p, "~") {
		return absPath(p)
	}
	who, rest, _ := strings.Cut(p[1:], "/")
	var e passwdEntry
	var err error
	if who == "" {
		e, err = lookupUser(user)
	} else {
		e, err = findPasswd(func(e passwdEntry) bool { return e.name == who })
	}
	if err != nil {
		var ee *exitError
		if errors.As(err, &ee) {
			return "", failf(ee.code, "path %s: %s", p, ee.msg)
		}
		return "", err
	}
	if e.home == "" || !filepath.IsAbs(e.home) {
		return "", failf(ExitNotFound, "path %s: user %s has no home directory", p, cmp.Or(e.name, user))
	}
	return absPath(filepath.Join(e.home, rest))
}

// apiFileInfo is api.FileInfo, the description of one file, copied so that the
// agent does not link net/http with package api; a test checks that both
// encode the same.
type apiFileInfo struct {
	Name    string    `json:"name"`
	Path    string    `json:"path,omitempty"`
	Size    int64     `json:"size"`
	Mode    string    `json:"mode"`
	IsDir   bool      `json:"isDir"`
	ModTime time.Time `json:"modTime"`
	Link    string    `json:"link,omitempty"`
	Raw     []byte    `json:"raw,omitempty"`
}

// fileInfo describes path from Lstat; a symlink's Link is its target.
func fileInfo(path string) (apiFileInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return apiFileInfo{}, err
	}
	info := apiFileInfo{
		Name:    filepath.Base(path),
		Path:    path,
		Size:    fi.Size(),
		Mode:    fi.Mode().String(),
		IsDir:   fi.IsDir(),
		ModTime: fi.ModTime(),
	}
	if !utf8.ValidString(info.Name) {
		info.Raw = []byte(info.Name) // JSON keeps only a valid string
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		if info.Link, err = os.Readlink(path); err != nil {
			return apiFileInfo{}, err
		}
	}
	return info, nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return failf(ExitError, "write output: %s", errText(err))
	}
	return nil
}

// errText is the innermost reason of err, without the operation and path
// that the caller's message already names.
func errText(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	var le *os.LinkError
	if errors.As(err, &le) {
		return le.Err.Error()
	}
	return err.Error()
}
