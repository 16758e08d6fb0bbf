package procfs

import (
	"os"
	"testing"
)

func TestUID(t *testing.T) {
	if uid, err := parseUID("Name:\tsh\nUid:\t1000\t1000\t1000\t1000\nGid:\t0\n"); err != nil || uid != 1000 {
		t.Errorf("parseUID = %d, %v", uid, err)
	}
	if _, err := parseUID("Name:\tsh\n"); err == nil {
		t.Error("no Uid line: no error")
	}
	if uid, err := UID(os.Getpid()); err != nil || uid != os.Getuid() {
		t.Errorf("UID(self) = %d, %v; want %d", uid, err, os.Getuid())
	}
}
