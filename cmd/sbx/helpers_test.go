package main

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestClassifyScp(t *testing.T) {
	tests := []struct {
		name, src, dst string
		wantSrc        scpPath
		wantDst        scpPath
		wantErr        bool
	}{
		{"upload", "a.txt", "sb_1:/tmp/", scpPath{path: "a.txt"}, scpPath{"sb_1", "/tmp/"}, false},
		{"download", "sb_1:/etc/hosts", ".", scpPath{"sb_1", "/etc/hosts"}, scpPath{path: "."}, false},
		{"named sandbox", "web:/x", "/tmp/y", scpPath{"web", "/x"}, scpPath{path: "/tmp/y"}, false},
		{"local with colon", "./a:b", "sb_1:/x", scpPath{path: "./a:b"}, scpPath{"sb_1", "/x"}, false},
		{"local dir with colon", "dir/a:b", "sb_1:/x", scpPath{path: "dir/a:b"}, scpPath{"sb_1", "/x"}, false},
		{"both local", "a", "b", scpPath{}, scpPath{}, true},
		{"both remote", "sb_1:/a", "sb_2:/b", scpPath{}, scpPath{}, true},
		{"empty remote path", "a", "sb_1:", scpPath{}, scpPath{}, true},
		{"leading colon is local", ":x", "sb_1:/x", scpPath{path: ":x"}, scpPath{"sb_1", "/x"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, d, err := classifyScp(tc.src, tc.dst)
			if tc.wantErr {
				var ue *usageError
				if !errors.As(err, &ue) {
					t.Fatalf("got %v, want a usage error", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s != tc.wantSrc || d != tc.wantDst {
				t.Errorf("got %+v %+v, want %+v %+v", s, d, tc.wantSrc, tc.wantDst)
			}
		})
	}
}

func TestShellWrap(t *testing.T) {
	tests := []struct {
		name string
		in   []string
		want []string
	}{
		{"plain word", []string{"ls"}, []string{"ls"}},
		{"argv", []string{"ls", "-l", "a b"}, []string{"ls", "-l", "a b"}},
		{"spaces", []string{"ls -l"}, []string{"/bin/sh", "-c", "ls -l"}},
		{"pipe", []string{"a|b"}, []string{"/bin/sh", "-c", "a|b"}},
		{"variable", []string{"echo$HOME"}, []string{"/bin/sh", "-c", "echo$HOME"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, shellWrap(tc.in)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestAge(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		d    time.Duration
		want string
	}{{5 * time.Second, "5s"}, {3 * time.Minute, "3m"}, {5 * time.Hour, "5h"}, {72 * time.Hour, "3d"}}
	for _, tc := range tests {
		if got := age(now, now.Add(-tc.d)); got != tc.want {
			t.Errorf("age(%v) got %q, want %q", tc.d, got, tc.want)
		}
	}
}
