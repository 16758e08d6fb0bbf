package agent

import (
	"archive/tar"
	"errors"
	"flag"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"sbx.dev/sbx/internal/safetar"
)

// writeTar writes a PAX tar of root (a file or a directory, recursively) to w,
// with entry names starting at the base name of root. Symlinks below root
// are stored as symlinks; root itself is resolved, as `get` resolves it.
func writeTar(root string, w io.Writer) error {
	real, err := filepath.EvalSymlinks(root)
	if err != nil {
		return pathError(root, err)
	}
	base := filepath.Base(root)
	if base == "/" {
		base = "."
	}
	err = safetar.Write(w, real, safetar.WriteOptions{Base: base, ExactTimes: true})
	var pe *fs.PathError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &pe):
		return pathError(pe.Path, pe)
	}
	return failf(ExitError, "%s", errText(err))
}

// runUntar extracts a tar from stdin under a directory. A new directory
// appears whole or not at all; into an existing one, entries are extracted
// one by one, each file through a temporary file renamed into place.
func runUntar(args []string, stdin io.Reader) error {
	fset := flag.NewFlagSet("untar", flag.ContinueOnError)
	user := userFlag(fset)
	pos, err := parseFlags(fset, args, 1, "untar [--user U] PATH")
	if err != nil {
		return err
	}
	dest, err := resolvePath(pos[0], *user)
	if err != nil {
		return err
	}
	// what a request for a user extracts is that user's: an upload of a
	// project is theirs to change, whoever owned it where it came from
	if *user != "" {
		if u, err := lookupUser(*user); err == nil && u.uid != 0 {
			extractOwner = &u
			defer func() { extractOwner = nil }()
		}
	}
	fi, err := os.Stat(dest)
	switch {
	case err == nil && !fi.IsDir():
		return invalidf("%s is not a directory", dest)
	case err == nil:
		real, err := filepath.EvalSymlinks(dest)
		if err != nil {
			return pathError(dest, err)
		}
		return extract(stdin, real)
	case !errors.Is(err, fs.ErrNotExist):
		return pathError(dest, err)
	}
	if dest == "/" {
		return invalidf("/ cannot be created")
	}
	if err := requireDir(filepath.Dir(dest)); err != nil {
		return err
	}
	tmp := tempName(dest)
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return pathError(filepath.Dir(dest), err)
	}
	if extractOwner != nil {
		_ = os.Lchown(tmp, extractOwner.uid, extractOwner.gid)
	}
	if err := extract(stdin, tmp); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	// rename would put a directory over an empty one; refuse as for any other
	if _, err := os.Lstat(dest); err == nil {
		os.RemoveAll(tmp)
		return failf(ExitExists, "%s was created while extracting", dest)
	}
	if err := os.Rename(tmp, dest); err != nil {
		os.RemoveAll(tmp)
		return pathError(dest, err)
	}
	syncDir(filepath.Dir(dest))
	return nil
}

// extractOwner, when set, owns everything untar extracts (one untar per
// agent process).
var extractOwner *passwdEntry

// extract writes the entries of the tar read from r under the existing
// directory root, with their owners (as root), modes, times and nodes. It
// fails on an archive without its end marker (two zero blocks), which is
// what a sender that went away between entries leaves.
func extract(r io.Reader, root string) error {
	o := safetar.Options{RequireEnd: true, KeepMode: true, KeepTimes: true, Fifos: true, Devices: true}
	if os.Geteuid() == 0 {
		o.Owner = func(hdr *tar.Header) (int, int) {
			if extractOwner != nil {
				return extractOwner.uid, extractOwner.gid
			}
			return hdr.Uid, hdr.Gid
		}
	}
	_, err := safetar.Extract(r, root, o)
	var te *safetar.Error
	switch {
	case err == nil:
		return nil
	case !errors.As(err, &te):
		return failf(ExitError, "read tar: %s", errText(err))
	case te.Entry == "":
		return failf(ExitError, "read tar: %s", errText(te.Err))
	case te.Kind == safetar.Invalid:
		return invalidf("tar entry %s: %s", te.Entry, te.Err)
	}
	return failf(ExitError, "tar entry %s: %s", te.Entry, errText(te.Err))
}
