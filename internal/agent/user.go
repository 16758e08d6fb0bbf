package agent

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Where the sandbox's users and groups are; variables for tests.
var (
	passwdFile = "/etc/passwd"
	groupFile  = "/etc/group"
)

// user is a user of the sandbox, as a command runs as it.
type user struct {
	name     string
	uid, gid uint32
	groups   []uint32
	home     string
}

// lookupUser resolves spec, "NAME", "UID", "NAME:GROUP" or "UID:GID", from
// the sandbox's own /etc/passwd and /etc/group. A numeric uid need not be
// listed (its home is then /); a name must be.
func lookupUser(spec string) (user, error) {
	name, group, hasGroup := strings.Cut(spec, ":")
	if name == "" || (hasGroup && group == "") {
		return user{}, fmt.Errorf("use NAME, UID, NAME:GROUP or UID:GID")
	}
	var u user
	found := false
	err := scanColon(passwdFile, 7, func(f []string) bool {
		if f[0] != name && f[2] != name {
			return true
		}
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		gid, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil {
			return true
		}
		u = user{name: f[0], uid: uint32(uid), gid: uint32(gid), home: f[5]}
		found = true
		return false
	})
	if err != nil && !os.IsNotExist(err) {
		return user{}, err
	}
	if !found {
		uid, err := strconv.ParseUint(name, 10, 32)
		if err != nil {
			return user{}, fmt.Errorf("no such user in %s", passwdFile)
		}
		u = user{name: name, uid: uint32(uid), gid: uint32(uid), home: "/"}
	}
	if u.home == "" {
		u.home = "/"
	}
	// supplementary groups: those that list the user by name
	_ = scanColon(groupFile, 4, func(f []string) bool {
		gid, err := strconv.ParseUint(f[2], 10, 32)
		if err != nil {
			return true
		}
		for _, m := range strings.Split(f[3], ",") {
			if m == u.name {
				u.groups = append(u.groups, uint32(gid))
			}
		}
		return true
	})
	if hasGroup {
		gid, err := strconv.ParseUint(group, 10, 32)
		if err != nil {
			found := false
			_ = scanColon(groupFile, 4, func(f []string) bool {
				if f[0] == group {
					if g, err := strconv.ParseUint(f[2], 10, 32); err == nil {
						gid, found = g, true
						return false
					}
				}
				return true
			})
			if !found {
				return user{}, fmt.Errorf("no such group %q in %s", group, groupFile)
			}
		}
		u.gid = uint32(gid)
	}
	return u, nil
}

// scanColon calls fn with the fields of each line of a colon-separated
// file that has at least n fields, until fn returns false.
func scanColon(path string, n int, fn func([]string) bool) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Split(line, ":")
		if len(fields) < n {
			continue
		}
		if !fn(fields) {
			break
		}
	}
	return sc.Err()
}
