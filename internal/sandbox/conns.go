package sandbox

import (
	"net"
	"sync"
)

// connTable keeps the connections sbxd has dialed into each sandbox (the
// preview proxy's), so that they end when the sandbox does. A connection
// into a sandbox that is gone gets no reset: its netstack, which would
// send one, went with it, and the client on the other side of the proxy
// would wait for ever.
type connTable struct {
	mu    sync.Mutex
	conns map[string]map[*trackedConn]struct{}
}

type trackedConn struct {
	net.Conn
	t    *connTable
	id   string
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() { c.t.forget(c) })
	return c.Conn.Close()
}

// track returns c, which from now on ends when closeAll(id) is called.
func (t *connTable) track(id string, c net.Conn) net.Conn {
	tc := &trackedConn{Conn: c, t: t, id: id}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.conns == nil {
		t.conns = map[string]map[*trackedConn]struct{}{}
	}
	if t.conns[id] == nil {
		t.conns[id] = map[*trackedConn]struct{}{}
	}
	t.conns[id][tc] = struct{}{}
	return tc
}

func (t *connTable) forget(c *trackedConn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.conns[c.id], c)
	if len(t.conns[c.id]) == 0 {
		delete(t.conns, c.id)
	}
}

// closeAll closes every connection into sandbox id.
func (t *connTable) closeAll(id string) {
	t.mu.Lock()
	cs := t.conns[id]
	delete(t.conns, id)
	t.mu.Unlock()
	for c := range cs {
		c.once.Do(func() {})
		_ = c.Conn.Close()
	}
}

// count returns how many connections into sandbox id are open.
func (t *connTable) count(id string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.conns[id])
}
