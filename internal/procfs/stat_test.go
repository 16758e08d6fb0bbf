package procfs

import (
	"errors"
	"os"
	"testing"
)

func TestParseStat(t *testing.T) {
	// a name with spaces and a ')' of its own
	st, err := ParseStat("4242 (a) b) (c) S 7 4242 4242 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 98765 1000 10 18446744073709551615\n")
	if err != nil {
		t.Fatal(err)
	}
	if st.Pid != 4242 || st.Comm != "a) b) (c" || st.State != 'S' || st.PPid != 7 || st.Start != "98765" || st.Gone() {
		t.Errorf("ParseStat: %+v", st)
	}
	for _, bad := range []string{"", "12", "12 (x", "x (sh) S 1", "12 (sh) S x 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 1", "12 (sh) S 1 2 3"} {
		if _, err := ParseStat(bad); err == nil {
			t.Errorf("ParseStat(%q): no error", bad)
		}
	}
	if z, _ := ParseStat("5 (z) Z 1 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 77"); !z.Gone() {
		t.Errorf("a zombie is not gone: %+v", z)
	}
}

func TestReadStat(t *testing.T) {
	me, err := ReadStat(os.Getpid())
	if err != nil || me.Pid != os.Getpid() || me.PPid != os.Getppid() || me.Start == "" || me.Gone() {
		t.Errorf("ReadStat(self) = %+v, %v", me, err)
	}
	if _, err := ReadStat(1 << 30); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("ReadStat of no process: %v, want ErrNotExist", err)
	}
}
