package api

import "time"

// The checks of the requests' fields, each written once: sbxd runs a
// request's Validate as it decodes the body, the Go client before it sends
// it, and the CLI reaches them through the client, so a bad field reads
// the same from all three. Each message leads with the field's JSON name.

// MaxForks is the most children one fork call makes.
const MaxForks = 16

// MaxPreviewTTL bounds how long a private preview's token lives.
const MaxPreviewTTL = 30 * 24 * time.Hour

// CheckForkCount checks n, the children a fork is asked for (callers read
// a count of 0 as 1 first). One fork call (tree false: sbxd's rule, and a
// client that does not wait for the children) makes 1 to MaxForks; a
// client that waits grows a tree past that, breadth-first, forking the
// ready children, so a tree is bounded only by sbxd's room. ErrInvalid.
func CheckForkCount(n int, tree bool) error {
	switch {
	case tree && n < 1:
		return Errorf(ErrInvalid, "count %d is out of range: a fork makes at least 1 sandbox", n)
	case !tree && (n < 1 || n > MaxForks):
		return Errorf(ErrInvalid, "count %d is out of range: a fork makes 1 to %d sandboxes per call; more grow a tree from the children, which must be ready: wait for them", n, MaxForks)
	}
	return nil
}

// Validate checks a create: ttl zero or more, the shaping's delay in
// bounds. ErrInvalid naming the field.
func (r *CreateRequest) Validate() error {
	if err := checkDuration("ttl", r.TTL, 0, 0); err != nil {
		return err
	}
	if err := CheckOwnMeta(r.Meta); err != nil {
		return err
	}
	return r.Shape.Validate()
}

// Validate checks one fork call: its count (CheckForkCount), a name only
// on a single child, its ttl and shaping. ErrInvalid naming the field.
func (r *ForkRequest) Validate() error {
	count := r.Count
	if count == 0 {
		count = 1
	}
	if err := CheckForkCount(count, false); err != nil {
		return err
	}
	if r.Name != "" && count > 1 {
		return Errorf(ErrInvalid, "name: only a single fork can be named")
	}
	if err := CheckOwnMeta(r.Meta); err != nil {
		return err
	}
	if r.TTL != nil {
		if err := checkDuration("ttl", *r.TTL, 0, 0); err != nil {
			return err
		}
	}
	return r.Shape.Validate()
}

// Validate checks a shaping (nil is none): a delay of 0 to MaxNetDelay.
// The loss is the runtime's to check, with the rest of the shape.
func (s *NetShape) Validate() error {
	if s == nil {
		return nil
	}
	return checkDuration("netShape.delay", s.Delay, 0, MaxNetDelay)
}

// Validate checks a ttl change: zero (none) or more.
func (r *TTLRequest) Validate() error { return checkDuration("ttl", r.TTL, 0, 0) }

// Validate checks a preview: a TCP port, a ttl only on a private one, 1s
// to MaxPreviewTTL. ErrInvalid naming the field.
func (r *PreviewRequest) Validate() error {
	if r.Port < 1 || r.Port > 65535 {
		return Errorf(ErrInvalid, "port: %d is not a TCP port (1-65535)", r.Port)
	}
	if r.TTL == nil {
		return nil
	}
	if !r.Private {
		return Errorf(ErrInvalid, "ttl: only a private preview expires; add private")
	}
	return checkDuration("ttl", *r.TTL, time.Second, MaxPreviewTTL)
}

// Validate checks an exec's timeout: zero (none) or more.
func (r *ExecRequest) Validate() error { return checkDuration("timeout", r.Timeout, 0, 0) }

// Validate checks a prune's olderThan: zero or more.
func (r *PruneRequest) Validate() error { return checkDuration("olderThan", r.OlderThan, 0, 0) }

// CheckOwnMeta refuses the meta keys sbx sets itself: the fleet's object
// and the warm pool's mark.
func CheckOwnMeta(meta map[string]string) error {
	for _, k := range []string{MetaObject, MetaObjectUID, MetaObjectNamespace} {
		if _, ok := meta[k]; ok {
			return Errorf(ErrInvalid, "meta: %s is the fleet's: a node agent sets it for the Sandbox object it makes a sandbox for", k)
		}
	}
	if _, ok := meta[MetaPool]; ok {
		return Errorf(ErrInvalid, "meta: %s is sbxd's: it marks a sandbox of its warm pool", MetaPool)
	}
	for _, k := range []string{MetaImageRef, MetaImagePending} {
		if _, ok := meta[k]; ok {
			return Errorf(ErrInvalid, "meta: %s is sbxd's: it says where a stopped sandbox's image is in the fleet's registry", k)
		}
	}
	if _, ok := meta[MetaAdopted]; ok {
		return Errorf(ErrInvalid, "meta: %s is sbxd's: it names the artifact a sandbox moved from another node in", MetaAdopted)
	}
	return nil
}
