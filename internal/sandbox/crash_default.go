//go:build !sbxtest

package sandbox

// crashPoint is a no-op outside test builds; see crash_sbxtest.go.
func crashPoint(string) {}
