package agent

import (
	"os"
	"os/signal"
	"syscall"
)

// runInit is the first process of every sandbox. It holds the sandbox open,
// reaps the orphans the sandbox's processes leave (they are re-parented to
// it), and ends on SIGTERM or SIGINT, which ends the sandbox.
func runInit() int {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGCHLD, syscall.SIGTERM, syscall.SIGINT)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			return 0
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
	return 0
}
