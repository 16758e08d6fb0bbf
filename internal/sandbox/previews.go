package sandbox

import (
	"context"
	"net"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/store"
)

// The preview proxy serves only the ports a user published. Publications
// are kept in the store: they outlive a restart of sbxd and a stop and
// resume of the sandbox (its id is what they name), and go with the
// sandbox when it is deleted. Forks and sandboxes made from snapshots do
// not inherit them: a fork is a new sandbox at a new address, and the
// flaky-test workflows make forks by the dozen; each is published on its
// own if wanted.

// previews owns the publications of ports and the connections sbxd dials
// into sandboxes for the proxy. It needs only what previewHost gives.
type previews struct {
	host  previewHost
	conns connTable // its own lock; see conns.go
}

// previewHost is what the previews owner needs of the rest of the manager.
type previewHost interface {
	Sandbox(ctx context.Context, ref string) (*store.Sandbox, error)
	Publish(ctx context.Context, id string, port int, private bool, at time.Time) (*store.Preview, error)
	Unpublish(ctx context.Context, id string, port int) error
	Published(ctx context.Context, id string, port int) (*store.Preview, error)
	Previews(ctx context.Context, id string) ([]*store.Preview, error)
	// running is the sandbox ref if it is ready, else why not.
	running(ctx context.Context, ref string) (*store.Sandbox, error)
	dial(ctx context.Context, id string, port int) (net.Conn, error)
	now() time.Time
}

func checkPort(port int) error {
	if port < 1 || port > 65535 {
		return api.Errorf(api.ErrInvalid, "port: %d is not a TCP port (1-65535)", port)
	}
	return nil
}

func noNetwork(sb *store.Sandbox) error {
	return api.Errorf(api.ErrConflict, "sandbox %s has no network (network %q): nothing outside it can reach its ports", sb.ID, NetworkNone)
}

// publish publishes port of sandbox ref on the preview proxy, private or
// not, and returns the sandbox's id (preview hosts carry ids, not names).
// A bad port is api.ErrInvalid; an unknown sandbox api.ErrNotFound; a
// sandbox without a network, or a private port published again without
// private, api.ErrConflict. It returns the publication's generation too
// (Published). Not activity.
func (p *previews) publish(ctx context.Context, ref string, port int, private bool) (string, int64, error) {
	if err := checkPort(port); err != nil {
		return "", 0, err
	}
	sb, err := p.host.Sandbox(ctx, ref)
	if err != nil {
		return "", 0, err
	}
	if sb.Network == NetworkNone {
		return "", 0, noNetwork(sb)
	}
	pub, err := p.host.Publish(ctx, sb.ID, port, private, p.host.now())
	if err != nil {
		return "", 0, err
	}
	return sb.ID, pub.CreatedAt.UnixNano(), nil
}

// unpublish withdraws port of sandbox ref from the preview proxy: from then
// on requests to it are 404. An unknown sandbox or a port not published is
// api.ErrNotFound.
func (p *previews) unpublish(ctx context.Context, ref string, port int) error {
	if err := checkPort(port); err != nil {
		return err
	}
	sb, err := p.host.Sandbox(ctx, ref)
	if err != nil {
		return err
	}
	return p.host.Unpublish(ctx, sb.ID, port)
}

// list lists the ports published of sandbox ref (Port and Private set;
// the URL is the proxy's to make). An unknown sandbox is api.ErrNotFound.
func (p *previews) list(ctx context.Context, ref string) (string, []api.Preview, error) {
	sb, err := p.host.Sandbox(ctx, ref)
	if err != nil {
		return "", nil, err
	}
	ps, err := p.host.Previews(ctx, sb.ID)
	if err != nil {
		return "", nil, err
	}
	out := make([]api.Preview, 0, len(ps))
	for _, pub := range ps {
		out = append(out, api.Preview{Port: pub.Port, Private: pub.Private})
	}
	return sb.ID, out, nil
}

// published reports whether port of sandbox id (an id, never a name) is
// published, whether privately, and its generation: when it was published
// (a port withdrawn and published again is a new publication, which the
// private URLs handed out for the old one do not open). A port not
// published, or a sandbox that does not exist, is api.ErrNotFound, the two
// alike. Not activity: the proxy calls it before anything else, for every
// request.
func (p *previews) published(ctx context.Context, id string, port int) (private bool, since int64, err error) {
	pub, err := p.host.Published(ctx, id, port)
	if err != nil {
		return false, 0, err
	}
	return pub.Private, pub.CreatedAt.UnixNano(), nil
}

// dial connects to a TCP port inside a running sandbox, from its gateway
// namespace. The caller accounts for activity (Lease). The connection ends
// when the sandbox stops or is deleted (closeAll).
func (p *previews) dial(ctx context.Context, ref string, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, api.Errorf(api.ErrInvalid, "port: %d is not a TCP port", port)
	}
	sb, err := p.host.running(ctx, ref)
	if err != nil {
		return nil, err
	}
	if sb.Network == NetworkNone {
		return nil, noNetwork(sb)
	}
	c, err := p.host.dial(ctx, sb.ID, port)
	if err != nil {
		return nil, err
	}
	return p.conns.track(sb.ID, c), nil
}

// closeAll ends every connection into sandbox id: it stopped, or is gone.
func (p *previews) closeAll(id string) { p.conns.closeAll(id) }

// previewHost, as the manager gives it: its store, and the rest by name.
type managerPreviewHost struct {
	*store.Store
	m *Manager
}

func (h managerPreviewHost) running(ctx context.Context, ref string) (*store.Sandbox, error) {
	return h.m.running(ctx, ref)
}
func (h managerPreviewHost) dial(ctx context.Context, id string, port int) (net.Conn, error) {
	return h.m.cfg.Networks.Dial(ctx, id, port)
}
func (h managerPreviewHost) now() time.Time { return h.m.now() }

// The facade: what server calls.

// Publish: see previews.publish.
func (m *Manager) Publish(ctx context.Context, ref string, port int, private bool) (string, int64, error) {
	return m.previews.publish(ctx, ref, port, private)
}

// Unpublish: see previews.unpublish.
func (m *Manager) Unpublish(ctx context.Context, ref string, port int) error {
	return m.previews.unpublish(ctx, ref, port)
}

// Previews: see previews.list.
func (m *Manager) Previews(ctx context.Context, ref string) (string, []api.Preview, error) {
	return m.previews.list(ctx, ref)
}

// Published: see previews.published.
func (m *Manager) Published(ctx context.Context, id string, port int) (bool, int64, error) {
	return m.previews.published(ctx, id, port)
}

// Dial: see previews.dial.
func (m *Manager) Dial(ctx context.Context, ref string, port int) (net.Conn, error) {
	return m.previews.dial(ctx, ref, port)
}
