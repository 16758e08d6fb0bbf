// Command sbx-agent is the helper sbxd runs inside each sandbox through
// `runsc exec`; see package sbx.dev/sbx/internal/agent.
package main

import (
	"os"
	"path/filepath"

	"sbx.dev/sbx/internal/agent"
)

func main() {
	args := os.Args[1:]
	// /.sbx/freeze is a link to the agent
	if filepath.Base(os.Args[0]) == "freeze" {
		args = append([]string{"freeze"}, args...)
	}
	os.Exit(agent.Main(args, os.Stdin, os.Stdout, os.Stderr))
}
