package controller

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
)

// NodeTokenOf is node name's own bearer token under the fleet's key:
// HMAC-SHA256(key, name), in hex. The controller derives each node's from
// the key it holds; a node is given only its own (scripts/fleet.sh makes
// it with openssl dgst -hmac, the same function), so one node's token, or
// one stolen by an address a SandboxNode was made to name, opens no other.
func NodeTokenOf(key []byte, name string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(name))
	return hex.EncodeToString(m.Sum(nil))
}

// authorizeTo sets h's bearer token for a request to node n: its own, or
// the fleet's shared one.
func (c *Controller) authorizeTo(h http.Header, n *node) {
	token := c.cfg.NodeToken
	if len(c.cfg.NodeTokenKey) > 0 {
		token = NodeTokenOf(c.cfg.NodeTokenKey, n.obj.GetName())
	}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
}
