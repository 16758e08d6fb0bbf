package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// TestLeftoversSpareWhatIsMadeMeanwhile: removeLeftovers removes an image
// no record names, but not one made once it has read the records (a
// freeze recorded in the background: its journal entry, then its image,
// then the image's sync). Reading the records first and listing after
// removed such an image mid-sync, seen in CI as "sync image ...: open
// .../memory/pages_meta.img: no such file" after an sbxd restart.
func TestLeftoversSpareWhatIsMadeMeanwhile(t *testing.T) {
	m, _ := newTestManager(t, 0)
	mkImage := func(id string) string {
		dir := filepath.Join(m.images.root, id, memoryDir)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "pages_meta.img"), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		return filepath.Join(m.images.root, id)
	}
	stale := mkImage("im_stale")
	var fresh string
	testHookLeftoversRead = func() { fresh = mkImage("im_fresh") }
	t.Cleanup(func() { testHookLeftoversRead = func() {} })
	if err := m.removeLeftovers(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("an image no record names, there before: %v, want it removed", err)
	}
	if _, err := os.Stat(filepath.Join(fresh, memoryDir, "pages_meta.img")); err != nil {
		t.Errorf("an image made after the records were read: %v, want it kept", err)
	}
}
