package procfs

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// UID is the real uid of process pid, from /proc/PID/status.
func UID(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return parseUID(string(b))
}

func parseUID(status string) (int, error) {
	for _, l := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(l, "Uid:"); ok {
			if f := strings.Fields(v); len(f) > 0 {
				return strconv.Atoi(f[0])
			}
		}
	}
	return 0, fmt.Errorf("no Uid line in the status")
}
