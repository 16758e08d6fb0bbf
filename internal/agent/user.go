package agent

import (
	"io"
	"os"
	"strconv"
	"strings"
)

// The sandbox's user and group databases; tests point them elsewhere.
var (
	passwdFile = "/etc/passwd"
	groupFile  = "/etc/group"
)

// maxPasswd bounds how much of passwdFile or groupFile is read: they are
// the sandbox's, so anything may be in them.
const maxPasswd = 4 << 20

// passwdEntry is one user of passwdFile, with the groups that list it.
type passwdEntry struct {
	name     string
	uid, gid int
	home     string
	groups   []int
}

// lookupUser finds user (a name or a uid, either with ":group", a name or
// a gid) in passwdFile. A uid without an entry is still that uid (and gid,
// else the uid); "" is root. Root without an entry has the home /root.
func lookupUser(user string) (passwdEntry, error) {
	if user == "" {
		user = "0"
	}
	name, group, hasGroup := strings.Cut(user, ":")
	if hasGroup && group == "" {
		return passwdEntry{}, invalidf("user %q: want NAME, UID, NAME:GROUP or UID:GID", user)
	}
	uid, numeric := -1, false
	if n, err := strconv.Atoi(name); err == nil && n >= 0 {
		uid, numeric = n, true
	}
	found, err := findPasswd(func(e passwdEntry) bool {
		if numeric {
			return e.uid == uid
		}
		return e.name == name
	})
	switch {
	case err == nil:
	case numeric:
		found = passwdEntry{name: name, uid: uid, gid: uid}
		if uid == 0 {
			found.home = "/root"
		}
	default:
		return passwdEntry{}, err
	}
	// supplementary groups: those that list the user by name
	_ = scanGroups(func(g string, gid int, members []string) bool {
		for _, m := range members {
			if m == found.name {
				found.groups = append(found.groups, gid)
			}
		}
		return true
	})
	if hasGroup {
		g, err := strconv.Atoi(group)
		if err != nil {
			g = -1
			_ = scanGroups(func(name string, gid int, _ []string) bool {
				if name == group {
					g = gid
					return false
				}
				return true
			})
		}
		if g < 0 {
			return passwdEntry{}, failf(ExitNotFound, "no group %q in the sandbox's %s", group, groupFile)
		}
		found.gid = g
	}
	return found, nil
}

// findPasswd returns the first entry of passwdFile that match accepts.
func findPasswd(match func(passwdEntry) bool) (passwdEntry, error) {
	b, err := readBounded(passwdFile)
	if os.IsNotExist(err) {
		return passwdEntry{}, failf(ExitNotFound, "no such user: the sandbox has no %s", passwdFile)
	}
	if err != nil {
		return passwdEntry{}, pathError(passwdFile, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		// name:password:uid:gid:gecos:home:shell
		f := strings.Split(line, ":")
		if len(f) < 7 {
			continue
		}
		uid, err1 := strconv.Atoi(f[2])
		gid, err2 := strconv.Atoi(f[3])
		if err1 != nil || err2 != nil {
			continue
		}
		e := passwdEntry{name: f[0], uid: uid, gid: gid, home: f[5]}
		if match(e) {
			return e, nil
		}
	}
	return passwdEntry{}, failf(ExitNotFound, "no such user in the sandbox's %s", passwdFile)
}

// scanGroups calls fn with each group of groupFile until it returns false.
func scanGroups(fn func(name string, gid int, members []string) bool) error {
	b, err := readBounded(groupFile)
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(b), "\n") {
		// name:password:gid:member,member
		f := strings.Split(line, ":")
		if len(f) < 4 {
			continue
		}
		gid, err := strconv.Atoi(f[2])
		if err != nil {
			continue
		}
		if !fn(f[0], gid, strings.Split(f[3], ",")) {
			break
		}
	}
	return nil
}

func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, maxPasswd))
}
