package agent

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"testing/iotest"
	"time"

	"sbx.dev/sbx/api"
)

func TestGet(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "f"), "hello\n", 0o644)
	if err := os.Symlink("f", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		path    string
		code    int
		want    string
		wantErr string
	}{
		{"file", dir + "/f", 0, "hello\n", ""},
		{"symlink is followed", dir + "/link", 0, "hello\n", ""},
		{"directory", dir, ExitInvalid, "", "sbx-agent: " + dir + " is a directory: read it as a tar (the API's ?tar=1, sbx scp -r)\n"},
		{"missing", dir + "/nope", ExitNotFound, "", "sbx-agent: " + dir + "/nope does not exist\n"},
		{"parent is a file", dir + "/f/x", ExitInvalid, "", "not a directory"},
		{"relative", "f", ExitInvalid, "", "not absolute"},
		{"not a regular file", "/dev/null", ExitInvalid, "", "not a regular file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := run(t, nil, "get", tc.path)
			if code != tc.code {
				t.Errorf("exit code: got %d, want %d (stderr %q)", code, tc.code, stderr)
			}
			if stdout != tc.want {
				t.Errorf("stdout: got %q, want %q", stdout, tc.want)
			}
			if !strings.Contains(stderr, tc.wantErr) {
				t.Errorf("stderr: got %q, want it to contain %q", stderr, tc.wantErr)
			}
		})
	}
}

// tempFiles lists the agent's temporary files left in dir.
func tempFiles(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if strings.Contains(e.Name(), ".sbx-tmp-") {
			out = append(out, e.Name())
		}
	}
	return out
}

func TestPut(t *testing.T) {
	tests := []struct {
		name     string
		old      string // "" for no old file
		oldMode  os.FileMode
		stdin    string
		args     []string // before PATH
		path     string   // relative to the test dir; default "f"
		code     int
		wantErr  string
		want     string // content after; the old content when put fails
		wantMode os.FileMode
	}{
		{name: "new file", stdin: "hello", args: []string{"--size", "5"}, want: "hello", wantMode: 0o644},
		{name: "new file with mode", stdin: "hi", args: []string{"--size", "2", "--mode", "0600"}, want: "hi", wantMode: 0o600},
		{name: "replace keeps mode", old: "old", oldMode: 0o755, stdin: "new!", args: []string{"--size", "4"}, want: "new!", wantMode: 0o755},
		{name: "replace with mode", old: "old", oldMode: 0o755, stdin: "new!", args: []string{"--size", "4", "--mode", "640"}, want: "new!", wantMode: 0o640},
		{name: "empty file", stdin: "", args: []string{"--size", "0"}, want: "", wantMode: 0o644},
		{name: "reads exactly N bytes", stdin: "abcdef", args: []string{"--size", "3"}, want: "abc", wantMode: 0o644},
		{name: "short stdin keeps old file", old: "precious", oldMode: 0o600, stdin: "trunc", args: []string{"--size", "100"},
			code: ExitError, wantErr: "input ended after 5 of 100 bytes; the file was not changed", want: "precious", wantMode: 0o600},
		{name: "short stdin creates nothing", stdin: "x", args: []string{"--size", "2"}, code: ExitError, wantErr: "input ended"},
		{name: "missing directory", stdin: "x", args: []string{"--size", "1"}, path: "nodir/f", code: ExitNotFound, wantErr: "directory DIR/nodir does not exist"},
		{name: "path is a directory", stdin: "x", args: []string{"--size", "1"}, path: ".", code: ExitInvalid, wantErr: "is a directory"},
		{name: "no size", stdin: "x", code: ExitInvalid, wantErr: "--size N is required"},
		{name: "bad mode", stdin: "x", args: []string{"--size", "1", "--mode", "rwx"}, code: ExitInvalid, wantErr: "bad --mode"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "f")
			if tc.path != "" {
				path = filepath.Join(dir, tc.path)
			}
			if tc.old != "" {
				writeFile(t, path, tc.old, tc.oldMode)
			}
			// a reader that ends early, as a client that went away
			stdin := iotest.HalfReader(strings.NewReader(tc.stdin))
			code, _, stderr := run(t, stdin, append(append([]string{"put"}, tc.args...), path)...)
			if code != tc.code {
				t.Errorf("exit code: got %d, want %d (stderr %q)", code, tc.code, stderr)
			}
			if wantErr := strings.ReplaceAll(tc.wantErr, "DIR", dir); !strings.Contains(stderr, wantErr) {
				t.Errorf("stderr: got %q, want it to contain %q", stderr, wantErr)
			}
			if tmp := tempFiles(t, dir); len(tmp) > 0 {
				t.Errorf("temporary files left behind: %v", tmp)
			}
			if tc.path != "" {
				return
			}
			b, err := os.ReadFile(path)
			if tc.code != 0 && tc.old == "" {
				if !os.IsNotExist(err) {
					t.Errorf("read %s after a failed put: got %v, want not exist", path, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tc.want {
				t.Errorf("content: got %q, want %q", b, tc.want)
			}
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode() != tc.wantMode {
				t.Errorf("mode: got %s, want %s", fi.Mode(), tc.wantMode)
			}
		})
	}
}

func TestPutThroughSymlink(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "target"), "old", 0o644)
	if err := os.Symlink("target", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := run(t, strings.NewReader("new"), "put", "--size", "3", dir+"/link"); code != 0 {
		t.Fatalf("put: exit code %d: %s", code, stderr)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "target")); string(b) != "new" {
		t.Errorf("target: got %q, want %q", b, "new")
	}
	if l, err := os.Readlink(filepath.Join(dir, "link")); err != nil || l != "target" {
		t.Errorf("link: got %q, %v; want it kept", l, err)
	}
}

func TestStatAndLs(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "b-file"), "12345", 0o640)
	if err := os.Mkdir(filepath.Join(dir, "a-dir"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("b-file", filepath.Join(dir, "c-link")); err != nil {
		t.Fatal(err)
	}
	mtime := time.Date(2024, 2, 3, 4, 5, 6, 0, time.UTC)
	if err := os.Chtimes(filepath.Join(dir, "b-file"), mtime, mtime); err != nil {
		t.Fatal(err)
	}

	t.Run("stat symlink", func(t *testing.T) {
		code, stdout, stderr := run(t, nil, "stat", dir+"/c-link")
		if code != 0 {
			t.Fatalf("exit code %d: %s", code, stderr)
		}
		var got api.FileInfo
		if err := json.Unmarshal([]byte(stdout), &got); err != nil {
			t.Fatal(err)
		}
		if got.Name != "c-link" || got.Path != dir+"/c-link" || got.Link != "b-file" || got.Mode != "Lrwxrwxrwx" || got.IsDir {
			t.Errorf("got %+v, want name c-link, link b-file, mode Lrwxrwxrwx", got)
		}
	})
	t.Run("stat file", func(t *testing.T) {
		_, stdout, _ := run(t, nil, "stat", dir+"/b-file")
		var got api.FileInfo
		if err := json.Unmarshal([]byte(stdout), &got); err != nil {
			t.Fatal(err)
		}
		want := api.FileInfo{Name: "b-file", Path: dir + "/b-file", Size: 5, Mode: "-rw-r-----", ModTime: mtime}
		if !got.ModTime.Equal(want.ModTime) {
			t.Errorf("modTime: got %s, want %s", got.ModTime, want.ModTime)
		}
		got.ModTime = want.ModTime
		if !reflect.DeepEqual(got, want) {
			t.Errorf("got %+v, want %+v", got, want)
		}
	})
	t.Run("stat missing", func(t *testing.T) {
		if code, _, _ := run(t, nil, "stat", dir+"/nope"); code != ExitNotFound {
			t.Errorf("exit code: got %d, want %d", code, ExitNotFound)
		}
	})
	t.Run("ls", func(t *testing.T) {
		code, stdout, stderr := run(t, nil, "ls", dir)
		if code != 0 {
			t.Fatalf("exit code %d: %s", code, stderr)
		}
		var got []api.FileInfo
		if err := json.Unmarshal([]byte(stdout), &got); err != nil {
			t.Fatal(err)
		}
		var names, modes, links []string
		for _, fi := range got {
			names, modes, links = append(names, fi.Name), append(modes, fi.Mode), append(links, fi.Link)
		}
		if want := []string{"a-dir", "b-file", "c-link"}; !slices.Equal(names, want) {
			t.Errorf("names: got %v, want %v", names, want)
		}
		if want := []string{"drwxr-x---", "-rw-r-----", "Lrwxrwxrwx"}; !slices.Equal(modes, want) {
			t.Errorf("modes: got %v, want %v", modes, want)
		}
		if want := []string{"", "", "b-file"}; !slices.Equal(links, want) {
			t.Errorf("links: got %v, want %v", links, want)
		}
	})
	t.Run("ls pages", func(t *testing.T) {
		page := func(args ...string) []string {
			code, stdout, stderr := run(t, nil, append([]string{"ls"}, append(args, dir)...)...)
			if code != 0 {
				t.Fatalf("ls %v: exit code %d: %s", args, code, stderr)
			}
			var got []api.FileInfo
			if err := json.Unmarshal([]byte(stdout), &got); err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, fi := range got {
				names = append(names, fi.Name)
			}
			return names
		}
		for _, c := range []struct {
			args []string
			want []string
		}{
			{[]string{"--limit", "2"}, []string{"a-dir", "b-file"}},
			{[]string{"--limit", "2", "--after", "b-file"}, []string{"c-link"}},
			{[]string{"--after", "a"}, []string{"a-dir", "b-file", "c-link"}},
			{[]string{"--after", "a-dir"}, []string{"b-file", "c-link"}},
			{[]string{"--after", "b-fil~"}, []string{"c-link"}},
			{[]string{"--after", "c-link"}, nil},
		} {
			if got := page(c.args...); !slices.Equal(got, c.want) {
				t.Errorf("ls %v: got %v, want %v", c.args, got, c.want)
			}
		}
	})
	t.Run("ls empty", func(t *testing.T) {
		_, stdout, _ := run(t, nil, "ls", dir+"/a-dir")
		if stdout != "[]\n" {
			t.Errorf("got %q, want %q", stdout, "[]\n")
		}
	})
	t.Run("ls file", func(t *testing.T) {
		code, _, stderr := run(t, nil, "ls", dir+"/b-file")
		if code != ExitInvalid || !strings.Contains(stderr, "is not a directory") {
			t.Errorf("got %d %q, want %d and \"is not a directory\"", code, stderr, ExitInvalid)
		}
	})
}

// The agent's copy of api.FileInfo must stay the same type on the wire.
func TestFileInfoMatchesAPI(t *testing.T) {
	info := apiFileInfo{Name: "n", Path: "/p/n", Size: 3, Mode: "-rw-r--r--", IsDir: true,
		ModTime: time.Date(2024, 1, 2, 3, 4, 5, 6, time.UTC), Link: "l"}
	ours, err := json.Marshal(info)
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := json.Marshal(api.FileInfo(info))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ours, theirs) {
		t.Errorf("got %s, want %s", ours, theirs)
	}
}

// fakePasswd points the agent at a passwd file of its own for the test.
func fakePasswd(t *testing.T, content string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "passwd")
	writeFile(t, p, content, 0o644)
	g := filepath.Join(t.TempDir(), "group")
	writeFile(t, g, "root:x:0:\nstaff:x:50:user\n", 0o644)
	old, oldGroup := passwdFile, groupFile
	passwdFile, groupFile = p, g
	t.Cleanup(func() { passwdFile, groupFile = old, oldGroup })
}

func TestResolvePath(t *testing.T) {
	fakePasswd(t, "root:x:0:0:root:/root:/bin/sh\n"+
		"user:x:1000:1000:,,,:/home/user:/bin/bash\n"+
		"broken line\n"+
		"nohome:x:1001:1001::relative:/bin/sh\n"+
		"svc:x:999:999::/srv/svc:/usr/sbin/nologin\n")
	tests := []struct {
		name, path, user string
		want             string
		code             int
	}{
		{"absolute", "/etc/hosts", "", "/etc/hosts", 0},
		{"absolute is cleaned", "/a/../b//c", "user", "/b/c", 0},
		{"relative", "x/y", "", "", ExitInvalid},
		{"home of root by default", "~", "", "/root", 0},
		{"root's file", "~/f.txt", "", "/root/f.txt", 0},
		{"the user's home", "~/f.txt", "user", "/home/user/f.txt", 0},
		{"by uid", "~/f", "1000", "/home/user/f", 0},
		{"by uid:gid", "~/f", "1000:1000", "/home/user/f", 0},
		{"another's home", "~svc/data", "user", "/srv/svc/data", 0},
		{"~user alone", "~user", "", "/home/user", 0},
		{"cannot climb out by name", "~/../../etc/shadow", "user", "/etc/shadow", 0},
		{"unknown user", "~nobody/x", "", "", ExitNotFound},
		{"unknown request user", "~/x", "ghost", "", ExitNotFound},
		{"uid without an entry has no home", "~/x", "4242", "", ExitNotFound},
		{"home not absolute", "~nohome/x", "", "", ExitNotFound},
		{"a group by name", "~/x", "user:staff", "/home/user/x", 0},
		{"unknown group", "~/x", "user:nogroup", "", ExitNotFound},
		{"empty group", "~/x", "user:", "", ExitInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := resolvePath(tc.path, tc.user)
			if tc.code != 0 {
				var ee *exitError
				if !errors.As(err, &ee) || ee.code != tc.code {
					t.Fatalf("resolvePath(%q, %q) = %q, %v; want exit code %d", tc.path, tc.user, got, err, tc.code)
				}
				if !strings.Contains(err.Error(), tc.path) && tc.path != "x/y" {
					t.Errorf("error %q does not name the path", err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("resolvePath(%q, %q) = %q, %v; want %q", tc.path, tc.user, got, err, tc.want)
			}
		})
	}
}

func TestResolvePathWithoutPasswd(t *testing.T) {
	old := passwdFile
	passwdFile = filepath.Join(t.TempDir(), "none")
	t.Cleanup(func() { passwdFile = old })
	if got, err := resolvePath("~/x", ""); err != nil || got != "/root/x" {
		t.Errorf("root without a passwd file: got %q, %v; want /root/x", got, err)
	}
	if _, err := resolvePath("~user/x", ""); err == nil {
		t.Errorf("~user without a passwd file: got no error")
	}
}

func TestFilesUnderHome(t *testing.T) {
	home := t.TempDir()
	fakePasswd(t, "user:x:1000:1000::"+home+":/bin/sh\n")
	if code, _, stderr := run(t, strings.NewReader("hi"), "put", "--size", "2", "--user", "user", "~/note"); code != 0 {
		t.Fatalf("put ~/note: exit %d: %s", code, stderr)
	}
	if b, err := os.ReadFile(filepath.Join(home, "note")); err != nil || string(b) != "hi" {
		t.Fatalf("got %q, %v", b, err)
	}
	if os.Geteuid() == 0 {
		fi, _ := os.Stat(filepath.Join(home, "note"))
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != 1000 || st.Gid != 1000 {
			t.Errorf("a new file under the user's home is owned by %d:%d, want 1000:1000", st.Uid, st.Gid)
		}
	}
	code, stdout, stderr := run(t, nil, "get", "--user", "user", "~/note")
	if code != 0 || stdout != "hi" {
		t.Errorf("get ~/note: exit %d, %q, %s", code, stdout, stderr)
	}
	code, stdout, _ = run(t, nil, "stat", "--user", "user", "~/note")
	if code != 0 || !strings.Contains(stdout, `"path":"`+filepath.Join(home, "note")+`"`) {
		t.Errorf("stat ~/note: exit %d, %s", code, stdout)
	}
	code, stdout, _ = run(t, nil, "ls", "--user", "user", "~")
	if code != 0 || !strings.Contains(stdout, `"name":"note"`) {
		t.Errorf("ls ~: exit %d, %s", code, stdout)
	}
	code, _, stderr = run(t, nil, "stat", "~nobody/x")
	if code != ExitNotFound || !strings.Contains(stderr, "~nobody/x") {
		t.Errorf("stat ~nobody/x: exit %d, %s", code, stderr)
	}
}

// TestLsRawNames: a name that is not UTF-8 comes with its bytes (JSON
// carries only valid strings), and a page after it starts after those
// bytes, not after its mangled form (which sorts elsewhere).
func TestLsRawNames(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"a", "b\x80", "b\xc3\xa9", "c"} {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ls := func(args ...string) []api.FileInfo {
		code, stdout, stderr := run(t, nil, append([]string{"ls"}, append(args, dir)...)...)
		if code != 0 {
			t.Fatalf("ls %q: exit %d: %s", args, code, stderr)
		}
		var got []api.FileInfo
		if err := json.Unmarshal([]byte(stdout), &got); err != nil {
			t.Fatal(err)
		}
		return got
	}
	first := ls("--limit", "2")
	if len(first) != 2 || string(first[1].Raw) != "b\x80" || first[1].Name != "b\uFFFD" || first[0].Raw != nil {
		t.Fatalf("first page: %+v; want a, then b\\x80 with its raw bytes", first)
	}
	var names []string
	for _, fi := range ls("--limit", "2", "--after-hex", hex.EncodeToString(first[1].Raw)) {
		names = append(names, fi.Name)
	}
	if want := []string{"b\u00e9", "c"}; !slices.Equal(names, want) {
		t.Errorf("the page after b\\x80: %q, want %q", names, want)
	}
}
