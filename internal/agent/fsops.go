package agent

import (
	"errors"
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// runMkdir makes a directory and any missing parents (mkdir -p). The
// directories it makes belong to --user; an existing directory is no error,
// an existing file is ExitExists.
func runMkdir(args []string) error {
	const syntax = "mkdir [--mode 0755] [--user U] PATH"
	fset := flag.NewFlagSet("mkdir", flag.ContinueOnError)
	modeFlag := fset.String("mode", "0755", "permission bits of the directories made, octal")
	user := userFlag(fset)
	pos, err := parseFlags(fset, args, 1, syntax)
	if err != nil {
		return err
	}
	m, err := strconv.ParseUint(*modeFlag, 8, 32)
	if err != nil || m > 0o7777 {
		return invalidf("mkdir: bad --mode %q; give octal permission bits like 0755", *modeFlag)
	}
	path, err := resolvePath(pos[0], *user)
	if err != nil {
		return err
	}
	uid, gid := -1, -1
	if *user != "" {
		if u, err := lookupUser(*user); err == nil {
			uid, gid = u.uid, u.gid
		}
	}
	return mkdirAll(path, os.FileMode(m), uid, gid)
}

// mkdirAll is os.MkdirAll that gives each directory it makes to uid:gid
// (when not -1) and sets its mode whatever the umask.
func mkdirAll(path string, mode os.FileMode, uid, gid int) error {
	fi, err := os.Stat(path)
	switch {
	case err == nil && fi.IsDir():
		return nil
	case err == nil:
		return failf(ExitExists, "%s exists and is not a directory", path)
	case !errors.Is(err, fs.ErrNotExist):
		return pathError(path, err)
	}
	if parent := filepath.Dir(path); parent != path {
		if err := mkdirAll(parent, mode, uid, gid); err != nil {
			return err
		}
	}
	if err := os.Mkdir(path, mode); err != nil {
		if errors.Is(err, fs.ErrExist) {
			if fi, serr := os.Stat(path); serr == nil && fi.IsDir() {
				return nil // made meanwhile
			}
		}
		return pathError(path, err)
	}
	if uid >= 0 {
		if err := os.Lchown(path, uid, gid); err != nil && os.Geteuid() == 0 {
			return pathError(path, err)
		}
	}
	if err := os.Chmod(path, mode); err != nil {
		return pathError(path, err)
	}
	return nil
}

// runRm removes a file, a symlink (not what it points to) or an empty
// directory; with -r a directory and everything in it. A path that does
// not exist is ExitNotFound, unless -r (rm -rf does not mind).
func runRm(args []string) error {
	const syntax = "rm [-r] [--user U] PATH"
	fset := flag.NewFlagSet("rm", flag.ContinueOnError)
	recursive := fset.Bool("r", false, "remove a directory and everything in it")
	user := userFlag(fset)
	pos, err := parseFlags(fset, args, 1, syntax)
	if err != nil {
		return err
	}
	path, err := resolvePath(pos[0], *user)
	if err != nil {
		return err
	}
	if path == "/" {
		return invalidf("rm: refusing to remove /")
	}
	if *recursive {
		if err := os.RemoveAll(path); err != nil {
			return pathError(path, err)
		}
		return nil
	}
	if err := os.Remove(path); err != nil {
		if errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) {
			return failf(ExitExists, "%s is a directory that is not empty; remove it recursively", path)
		}
		return pathError(path, err)
	}
	return nil
}

// runMv renames FROM to TO (rename(2): a file at TO is replaced; a
// directory only by a directory, and only an empty one).
func runMv(args []string) error {
	const syntax = "mv [--user U] FROM TO"
	fset := flag.NewFlagSet("mv", flag.ContinueOnError)
	user := userFlag(fset)
	pos, err := parseFlags(fset, args, 2, syntax)
	if err != nil {
		return err
	}
	from, err := resolvePath(pos[0], *user)
	if err != nil {
		return err
	}
	to, err := resolvePath(pos[1], *user)
	if err != nil {
		return err
	}
	if _, err := os.Lstat(from); err != nil {
		return pathError(from, err)
	}
	if err := os.Rename(from, to); err != nil {
		switch {
		case errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST):
			return failf(ExitExists, "%s is a directory that is not empty", to)
		case errors.Is(err, syscall.EINVAL):
			return invalidf("cannot move %s into itself (%s)", from, to)
		}
		return pathError(to, err)
	}
	syncDir(filepath.Dir(to))
	return nil
}
