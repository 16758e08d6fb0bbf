// Command sbx-shim is the host-side process that owns one exec (its
// `runsc exec`, or its connection on the exec channel) or one sandbox's
// console for as long as it runs: internal/runsc/shim.go. sbxd starts it
// from beside itself for every exec that cannot go over the exec channel
// and for every boot's console; without it sbxd starts itself as the
// shim, the same code in a binary that takes ten times longer to start
// (sbxd links the fleet's Kubernetes client, Prometheus and SQLite).
package main

import (
	"fmt"
	"os"

	"sbx.dev/sbx/internal/runsc"
)

func main() {
	if len(os.Args) < 2 || os.Args[1] != runsc.ShimArg {
		fmt.Fprintf(os.Stderr, "sbx-shim: sbxd starts this, as `sbx-shim %s DIR`; it is not run by hand\n", runsc.ShimArg)
		os.Exit(2)
	}
	os.Exit(runsc.ShimMain(os.Args[2:]))
}
