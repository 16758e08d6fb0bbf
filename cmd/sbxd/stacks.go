package main

import (
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"
)

// dumpStacksOnUSR1 writes every goroutine's stack to w, grouped by stack
// with a count, each time sbxd gets SIGUSR1, as containerd does: the way
// to see what a daemon that will not let go of something is waiting on,
// without stopping it.
func dumpStacksOnUSR1(w io.Writer) {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGUSR1)
	go func() {
		for range c {
			io.WriteString(w, "=== sbxd goroutine stacks (SIGUSR1) ===\n")
			pprof.Lookup("goroutine").WriteTo(w, 1)
			io.WriteString(w, "=== end of stacks ===\n")
		}
	}()
}
