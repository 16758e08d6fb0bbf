package sandbox

import (
	"context"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/store"
)

// TestStateTable holds the table to the diagram in ARCHITECTURE.md: the
// moves it allows, every one, and no other. A new move is a change made
// here on purpose.
func TestStateTable(t *testing.T) {
	c, r, sg, sd, e, l := api.StateCreating, api.StateReady, api.StateStopping, api.StateStopped, api.StateError, api.StateLost
	want := map[[2]api.State]bool{
		{c, r}: true, {c, e}: true, // booted; an undo that failed
		{r, sg}: true, {sg, r}: true, {sg, sd}: true, // stop, undone, done
		{sd, r}: true,                // resume
		{r, sd}: true, {e, sd}: true, // a restart adopts a complete image
		{r, e}: true, {sg, e}: true, // ended on its own; runsc cannot say
		{r, l}: true, {sg, l}: true, // runsc lost it while sbxd was away
		{sd, e}: true, {e, e}: true, {l, e}: true, // a delete that failed (from any state)
	}
	for _, f := range api.States {
		for _, to := range api.States {
			if got := allowed(f, to); got != want[[2]api.State{f, to}] {
				t.Errorf("allowed(%s, %s) = %v, want %v", f, to, got, !got)
			}
		}
	}
	names := map[string]bool{}
	for _, mv := range moves {
		if names[mv.name] {
			t.Errorf("move %q is in the table twice", mv.name)
		}
		names[mv.name] = true
		if len(mv.from) == 0 || !mv.to.Valid() {
			t.Errorf("move %q: from %v to %q", mv.name, mv.from, mv.to)
		}
		for _, f := range mv.from {
			if !f.Valid() {
				t.Errorf("move %q comes from %q, not a state", mv.name, f)
			}
		}
	}
}

// TestEveryTransitionGoesThroughTheTable reads the package: only state.go
// calls Store.Transition or says which states a change comes from.
func TestEveryTransitionGoesThroughTheTable(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if name == "state.go" || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.SelectorExpr:
				if n.Sel.Name == "Transition" {
					t.Errorf("%s: calls Transition itself; make a move of state.go", fset.Position(n.Pos()))
				}
			case *ast.CompositeLit:
				sel, ok := n.Type.(*ast.SelectorExpr)
				if !ok || sel.Sel.Name != "Change" {
					return true
				}
				for _, el := range n.Elts {
					if kv, ok := el.(*ast.KeyValueExpr); ok {
						if k, ok := kv.Key.(*ast.Ident); ok && (k.Name == "From" || k.Name == "To") {
							t.Errorf("%s: chooses its own states; make a move of state.go", fset.Position(kv.Pos()))
						}
					}
				}
			}
			return true
		})
	}
}

// TestMoveRefusesAnotherState: a move from a state it does not name is a
// conflict that names the state, and changes nothing.
func TestMoveRefusesAnotherState(t *testing.T) {
	ctx := context.Background()
	m, _ := newTestManager(t, 0)
	sb, err := m.Create(ctx, api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, mv := range []move{moveStopped, moveResumed, moveStopUndone, moveBooted} {
		err := m.move(ctx, sb.ID, mv, store.Change{})
		if !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), "is ready") {
			t.Errorf("move %s of a ready sandbox = %v, want a conflict saying it is ready", mv.name, err)
		}
	}
	if got, _ := m.Get(ctx, sb.ID); got.State != api.StateReady {
		t.Errorf("after refused moves: %s", got.State)
	}
	if err := requireState(&store.Sandbox{ID: "x", State: api.StateStopped}, api.StateReady); err == nil || !strings.Contains(err.Error(), "resume it first") {
		t.Errorf("requireState(stopped, ready) = %v", err)
	}
}
