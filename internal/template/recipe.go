package template

import (
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"go/scanner"
	"go/token"
	"strings"
	"sync"
)

// The code that makes a built template: the recipes (build.go) and the
// skeleton every rootfs gets (fs.go). A template's Source names the digest
// of that code, so a tiny or base made by other code is built again, and a
// cache of templates (the tests', a user's data dir after an upgrade) never
// serves what today's code would not make. A hand-kept recipe version was
// forgotten once: /etc's files left the skeleton, the version stayed, and a
// cache built before kept them.
var (
	//go:embed build.go
	buildCode []byte
	//go:embed fs.go
	fsCode []byte
)

// recipeSep separates a built template's Source from its recipe digest.
const recipeSep = "; recipe "

var recipeOnce = sync.OnceValue(func() string {
	return codeDigest(buildCode, fsCode)
})

// recipe returns the digest of the code that builds templates (12 hex
// digits).
func recipe() string { return recipeOnce() }

// withRecipe is source as a built template records it: with the digest of
// the code that made it.
func withRecipe(source string) string { return source + recipeSep + recipe() }

// splitRecipe returns a Source without its recipe digest, and the digest
// ("" for a template made before digests were recorded, or imported).
func splitRecipe(source string) (what, digest string) {
	if i := strings.LastIndex(source, recipeSep); i >= 0 {
		return source[:i], source[i+len(recipeSep):]
	}
	return source, ""
}

// codeDigest hashes Go source by its tokens: comments and layout change
// nothing a build makes, so they do not change the digest either.
func codeDigest(files ...[]byte) string {
	h := sha256.New()
	for _, src := range files {
		fset := token.NewFileSet()
		f := fset.AddFile("", fset.Base(), len(src))
		var s scanner.Scanner
		s.Init(f, src, nil, 0) // comments are skipped
		for {
			_, tok, lit := s.Scan()
			if tok == token.EOF {
				break
			}
			if tok == token.SEMICOLON && lit == "\n" {
				continue // inserted at a line's end: layout
			}
			h.Write([]byte(tok.String()))
			h.Write([]byte{0})
			h.Write([]byte(lit))
			h.Write([]byte{0})
		}
		h.Write([]byte{1})
	}
	return hex.EncodeToString(h.Sum(nil))[:12]
}
