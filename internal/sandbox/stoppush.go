package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"sbx.dev/sbx/api"
)

// In a fleet (Config.StopRepository) every stop image goes to the fleet's
// registry once the stop is done, so that another node can adopt the
// sandbox and resume it while this node is down. The push is in the
// background: the stop is done when its image is complete here, registry
// or not. A registry that fails keeps the image here, says so in the
// sandbox's meta (api.MetaImagePending), and is tried again, from 1 s
// doubling to 30 s, for as long as the sandbox is stopped on that image
// (and at sbxd's start, for any left unpushed). The ref, once pushed, is
// in its meta (api.MetaImageRef), for that image alone: a resume or the
// next stop drops it.

const (
	stopPushFirst = time.Second
	stopPushMax   = 30 * time.Second
)

// cutStopPush cuts the background push of sandbox id's stop image, if one
// is under way: what comes for the sandbox (a resume, a delete) does not
// wait for it; the push judges again whether the sandbox is still stopped
// on that image.
func (m *Manager) cutStopPush(id string) {
	m.stopPushes.mu.Lock()
	cancel := m.stopPushes.cancel[id]
	m.stopPushes.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// pushStopSoon pushes stopped sandbox id's image img in the background.
func (m *Manager) pushStopSoon(id, img string) {
	if m.cfg.StopRepository == "" || img == "" {
		return
	}
	go m.pushStop(context.Background(), id, img)
}

func (m *Manager) pushStop(ctx context.Context, id, img string) {
	wait := stopPushFirst
	for {
		sb, err := m.cfg.Store.Sandbox(ctx, id)
		if err != nil || sb.State != api.StateStopped || sb.Image != img || sb.Meta[api.MetaImageRef] != "" {
			return // resumed, deleted, stopped again (its own push), or pushed
		}
		actx, cancel := context.WithCancel(ctx)
		m.stopPushes.mu.Lock()
		if m.stopPushes.cancel == nil {
			m.stopPushes.cancel = map[string]context.CancelFunc{}
		}
		m.stopPushes.cancel[id] = cancel
		m.stopPushes.mu.Unlock()
		res, err := m.PushSandbox(actx, id, api.PushRequest{Ref: m.cfg.StopRepository + ":" + id + "-" + img})
		m.stopPushes.mu.Lock()
		delete(m.stopPushes.cancel, id)
		m.stopPushes.mu.Unlock()
		cut := actx.Err() != nil
		cancel()
		if cut {
			// a resume or a delete came first: it takes the claim the push
			// let go, and the sandbox is judged again after it
			<-m.cfg.After(stopPushFirst)
			continue
		}
		if err == nil {
			ok, serr := m.cfg.Store.SetMetaKey(ctx, id, api.StateStopped, img, api.MetaImageRef, res.Ref)
			if serr == nil && ok {
				_, serr = m.cfg.Store.SetMetaKey(ctx, id, api.StateStopped, img, api.MetaImagePending, "")
			}
			if serr != nil {
				m.log.Warn("a pushed stop image: record its ref", "sandbox", id, "err", serr)
			}
			if ok {
				m.event(ctx, id, "image.pushed", map[string]any{"ref": res.Ref, "bytes": res.Bytes})
			}
			return
		}
		if errors.Is(err, api.ErrConflict) || errors.Is(err, api.ErrNotFound) {
			return // no longer stopped: nothing to push
		}
		why := fmt.Sprintf("its image is kept here, not in the fleet's registry yet (%v): sbxd pushes it again in %s", err, wait)
		if ok, _ := m.cfg.Store.SetMetaKey(ctx, id, api.StateStopped, img, api.MetaImagePending, why); !ok {
			return
		}
		m.log.Warn("push a stop image to the fleet's registry; trying again", "sandbox", id, "err", err, "retry_in", wait)
		<-m.cfg.After(wait)
		wait = min(2*wait, stopPushMax)
	}
}
