package sandbox

import (
	"context"

	"sbx.dev/sbx/api"
)

// The preview proxy serves only the ports a user published. Publications
// are kept in the store: they outlive a restart of sbxd and a stop and
// resume of the sandbox (its id is what they name), and go with the
// sandbox when it is deleted. Forks and sandboxes made from snapshots do
// not inherit them: a fork is a new sandbox at a new address, and the
// flaky-test workflows make forks by the dozen; each is published on its
// own if wanted.

// Publish publishes port of sandbox ref on the preview proxy, private or
// not, and returns the sandbox's id (preview hosts carry ids, not names).
// A bad port is api.ErrInvalid; an unknown sandbox api.ErrNotFound; a
// sandbox without a network, or a private port published again without
// private, api.ErrConflict. It returns the publication's generation too
// (Published). Not activity.
func (m *Manager) Publish(ctx context.Context, ref string, port int, private bool) (string, int64, error) {
	if port < 1 || port > 65535 {
		return "", 0, api.Errorf(api.ErrInvalid, "port: %d is not a TCP port (1-65535)", port)
	}
	sb, err := m.cfg.Store.Sandbox(ctx, ref)
	if err != nil {
		return "", 0, err
	}
	if sb.Network == NetworkNone {
		return "", 0, api.Errorf(api.ErrConflict, "sandbox %s has no network (network %q): nothing outside it can reach its ports", sb.ID, NetworkNone)
	}
	p, err := m.cfg.Store.Publish(ctx, sb.ID, port, private, m.now())
	if err != nil {
		return "", 0, err
	}
	return sb.ID, p.CreatedAt.UnixNano(), nil
}

// Unpublish withdraws port of sandbox ref from the preview proxy: from then
// on requests to it are 404. An unknown sandbox or a port not published is
// api.ErrNotFound.
func (m *Manager) Unpublish(ctx context.Context, ref string, port int) error {
	if port < 1 || port > 65535 {
		return api.Errorf(api.ErrInvalid, "port: %d is not a TCP port (1-65535)", port)
	}
	sb, err := m.cfg.Store.Sandbox(ctx, ref)
	if err != nil {
		return err
	}
	return m.cfg.Store.Unpublish(ctx, sb.ID, port)
}

// Previews lists the ports published of sandbox ref (Port and Private set;
// the URL is the proxy's to make). An unknown sandbox is api.ErrNotFound.
func (m *Manager) Previews(ctx context.Context, ref string) (string, []api.Preview, error) {
	sb, err := m.cfg.Store.Sandbox(ctx, ref)
	if err != nil {
		return "", nil, err
	}
	ps, err := m.cfg.Store.Previews(ctx, sb.ID)
	if err != nil {
		return "", nil, err
	}
	out := make([]api.Preview, 0, len(ps))
	for _, p := range ps {
		out = append(out, api.Preview{Port: p.Port, Private: p.Private})
	}
	return sb.ID, out, nil
}

// Published reports whether port of sandbox id (an id, never a name) is
// published, whether privately, and its generation: when it was published
// (a port withdrawn and published again is a new publication, which the
// private URLs handed out for the old one do not open). A port not
// published, or a sandbox that does not exist, is api.ErrNotFound, the two
// alike. Not activity: the proxy calls it before anything else, for every
// request.
func (m *Manager) Published(ctx context.Context, id string, port int) (private bool, since int64, err error) {
	p, err := m.cfg.Store.Published(ctx, id, port)
	if err != nil {
		return false, 0, err
	}
	return p.Private, p.CreatedAt.UnixNano(), nil
}
