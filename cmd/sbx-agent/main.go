// Command sbx-agent is the helper sbxd runs inside each sandbox through
// `runsc exec`; see package sbx.dev/sbx/internal/agent.
package main

import (
	"os"

	"sbx.dev/sbx/internal/agent"
)

func main() {
	os.Exit(agent.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
