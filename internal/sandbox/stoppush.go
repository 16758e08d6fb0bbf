package sandbox

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode"

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
	// maxPendingWhy bounds the registry's words in api.MetaImagePending,
	// within a meta value's 1024 bytes (checkMeta): a registry picks them
	maxPendingWhy = 512
)

// clip is a registry's words s made fit for a record that kubectl and
// the CLI show: control and format characters blanked, cut to at most n
// bytes on a rune's edge, marked as cut.
func clip(s string, n int) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(s, " "))
	if len(s) <= n {
		return s
	}
	s = strings.ToValidUTF8(s[:n], "")
	return s + "…"
}

// pushStopSoon pushes stopped sandbox id's image img in the background.
func (m *Manager) pushStopSoon(id, img string) {
	if m.cfg.StopRepository == "" || img == "" || !fileExists(m.images.mem(img)) {
		return // none, or an image with no memory to move (adopted without it)
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
		// a push nobody asked for gives way to what a user asks of the
		// sandbox (a resume, a delete): a registry that hangs must not
		// hold them
		tctx, cancel := context.WithCancel(ctx)
		res, err := m.pushSandbox(tctx, id, api.PushRequest{Ref: m.cfg.StopRepository + ":" + id + "-" + img}, cancel)
		yielded := tctx.Err() != nil
		cancel()
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
		if yielded {
			<-m.cfg.After(stopPushFirst) // the top of the loop sees what it gave way to
			continue
		}
		// the registry's error says nothing of the sandbox (a registry's
		// 404 is its own: a repository it does not have): whether it is
		// still stopped on img is the guard's to say
		why := fmt.Sprintf("its image is kept here, not in the fleet's registry yet (%s): sbxd pushes it again in %s", clip(err.Error(), maxPendingWhy), wait)
		if ok, _ := m.cfg.Store.SetMetaKey(ctx, id, api.StateStopped, img, api.MetaImagePending, why); !ok {
			return // no longer stopped on img: nothing to push
		}
		m.log.Warn("push a stop image to the fleet's registry; trying again", "sandbox", id, "err", err, "retry_in", wait)
		<-m.cfg.After(wait)
		wait = min(2*wait, stopPushMax)
	}
}
