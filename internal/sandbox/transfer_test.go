package sandbox

import (
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"sbx.dev/sbx/api"
)

// TestRegistryError: what a registry does becomes the error kind a user
// can act on; an error that has its kind keeps it.
func TestRegistryError(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want error
	}{
		{&transport.Error{StatusCode: 401}, api.ErrForbidden},
		{&transport.Error{StatusCode: 403}, api.ErrForbidden},
		{fmt.Errorf("get: %w", &transport.Error{StatusCode: 404}), api.ErrNotFound},
		{&transport.Error{StatusCode: 500}, api.ErrUnavailable},
		{&net.OpError{Op: "dial", Err: errors.New("connection refused")}, api.ErrUnavailable},
		{errors.New(`could not parse reference: A B`), api.ErrInvalid},
		{api.Errorf(api.ErrConflict, "taken"), api.ErrConflict},
	} {
		got := registryError("pull", "r", tc.err)
		if !errors.Is(got, tc.want) {
			t.Errorf("registryError(%v) = %v, want kind %v", tc.err, got, tc.want)
		}
	}
	if got := registryError("pull", "r", errors.New("odd")); hasKind(got) {
		t.Errorf("an unknown error got a kind: %v", got)
	}
}
