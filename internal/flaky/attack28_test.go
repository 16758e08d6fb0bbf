package flaky

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAttack28EvidenceNoteUnbounded: the evidence's caps (files, bytes)
// leave TRUNCATED.txt out: every entry past the caps adds its whole name
// to the note, held in memory and written to the host. A hostile sandbox
// sends entries with ~1 MiB PAX names past maxEvidenceFiles: each costs
// it about 1 MiB of stream and costs the host that much memory (three
// times over: cut, Join, the note) and disk, with no end.
func TestAttack28EvidenceNoteUnbounded(t *testing.T) {
	setLimit(t, &maxEvidenceFiles, 1)
	var h hostileTar
	h.dir(".sbx-hunt/")
	h.file(".sbx-hunt/a.log", []byte("a\n"), 2)
	long := ".sbx-hunt/" + strings.Repeat("n", 900<<10)
	h.file(long, nil, 0)
	entry := h.v.parts[len(h.v.parts)-2:] // its header and its (empty) body
	for range 40 {
		h.v.parts = append(h.v.parts, entry...)
	}
	c := tarClient{tars: map[string]*hostileTar{HuntDir: &h}}
	dir := t.TempDir()
	if _, err := copyEvidence(context.Background(), c, "sb_x", dir); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, "TRUNCATED.txt"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("TRUNCATED.txt: %d bytes", fi.Size())
	if fi.Size() > 1<<20 {
		t.Errorf("TRUNCATED.txt is %d MiB on the host: what a sandbox leaves out past the caps still costs the host its names, unbounded", fi.Size()>>20)
	}
}
