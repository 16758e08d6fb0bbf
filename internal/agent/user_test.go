package agent

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestLookupUser(t *testing.T) {
	dir := t.TempDir()
	passwdFile, groupFile = filepath.Join(dir, "passwd"), filepath.Join(dir, "group")
	t.Cleanup(func() { passwdFile, groupFile = "/etc/passwd", "/etc/group" })
	os.WriteFile(passwdFile, []byte("root:x:0:0:root:/root:/bin/bash\n# a comment\nuser:x:1000:1000::/home/user:/bin/bash\nbroken:x:zz:1::/:/bin/sh\n"), 0o644)
	os.WriteFile(groupFile, []byte("root:x:0:\nsudo:x:27:user\nuser:x:1000:\ndocker:x:999:user,other\n"), 0o644)
	tests := []struct {
		spec    string
		want    passwdEntry
		wantErr bool
	}{
		{"user", passwdEntry{name: "user", uid: 1000, gid: 1000, groups: []int{27, 999}, home: "/home/user"}, false},
		{"1000", passwdEntry{name: "user", uid: 1000, gid: 1000, groups: []int{27, 999}, home: "/home/user"}, false},
		{"root", passwdEntry{name: "root", uid: 0, gid: 0, home: "/root"}, false},
		{"", passwdEntry{name: "root", uid: 0, gid: 0, home: "/root"}, false},
		{"user:sudo", passwdEntry{name: "user", uid: 1000, gid: 27, groups: []int{27, 999}, home: "/home/user"}, false},
		{"4242", passwdEntry{name: "4242", uid: 4242, gid: 4242}, false},
		{"4242:7", passwdEntry{name: "4242", uid: 4242, gid: 7}, false},
		{"nobody-here", passwdEntry{}, true},
		{"user:nogroup", passwdEntry{}, true},
		{":", passwdEntry{}, true},
		{"user:", passwdEntry{}, true},
		{"broken", passwdEntry{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.spec, func(t *testing.T) {
			got, err := lookupUser(tc.spec)
			if tc.wantErr {
				if err == nil {
					t.Errorf("got %+v, want an error", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(passwdEntry{})); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
