package sandbox

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestCollectAgents: at start, an agent build nothing names goes, unless it
// is among the keepAgents newest; one a sandbox booted on, an image was
// captured with or a freeze slot was armed for stays, however old, as do
// the current build and a damaged one set aside. A directory that cannot
// be read stops the collection: nothing goes.
func TestCollectAgents(t *testing.T) {
	m, _ := newTestManager(t, 0)
	versions := filepath.Join(m.agentRoot(), "v")
	key := func(c byte) string {
		b := make([]byte, 16)
		for i := range b {
			b[i] = c
		}
		return string(b)
	}
	// builds a..f, a the newest
	now := time.Now()
	for i, c := range []byte("abcdef") {
		d := filepath.Join(versions, key(c))
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, agentComplete), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		at := now.Add(-time.Duration(i+1) * time.Hour)
		if err := os.Chtimes(filepath.Join(d, agentComplete), at, at); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{key('9') + agentGoneSuffix, m.agentKey + ".damaged-1"} {
		if err := os.MkdirAll(filepath.Join(versions, d, "x"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// the three oldest are named: by a sandbox, an image, a freeze slot
	write := func(p, body string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(m.sandboxDir("sb_old"), sandboxAgentFile), key('d')+"\n")
	img, err := m.images.make(true)
	if err != nil {
		t.Fatal(err)
	}
	write(filepath.Join(m.images.dir(img), imageAgentFile), key('e')+"\n")
	meta, _ := json.Marshal(slotMeta{Name: "freeze-x", Sandbox: "sb_frozen", Agent: key('f')})
	write(filepath.Join(m.freezes.slotDir("sb_frozen", "im_slot"), slotMetaFile), string(meta))

	// a directory it cannot read (a file where the images are): nothing goes
	imagesRoot := m.images.root
	m.images.root = filepath.Join(m.agentRoot(), "v", key('a'), agentComplete)
	if err := m.collectAgents(); err == nil {
		t.Errorf("a collection that could not read the images went on")
	}
	m.images.root = imagesRoot
	for _, c := range []byte("abcdef") {
		if !m.hasAgent(key(c)) {
			t.Fatalf("build %c removed by a collection that could not read every reference", c)
		}
	}

	if err := m.collectAgents(); err != nil {
		t.Fatal(err)
	}
	kept := map[byte]bool{'a': true, 'b': true, 'd': true, 'e': true, 'f': true}
	for _, c := range []byte("abcdef") {
		if got := fileExists(filepath.Join(versions, key(c))); got != kept[c] {
			t.Errorf("build %c: kept %v, want %v", c, got, kept[c])
		}
	}
	if !m.hasAgent(m.agentKey) {
		t.Errorf("the current build was removed")
	}
	if !fileExists(filepath.Join(versions, m.agentKey+".damaged-1")) {
		t.Errorf("a damaged build set aside was removed (a running sandbox may mount it)")
	}
	if fileExists(filepath.Join(versions, key('9')+agentGoneSuffix)) {
		t.Errorf("what a removal cut short left is still there")
	}
	if fileExists(filepath.Join(versions, key('c')+agentGoneSuffix)) {
		t.Errorf("the removed build's directory is left aside")
	}
}
