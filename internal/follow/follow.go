// Package follow wakes the readers of what grows (a sandbox's events, a
// log file, an exec's output) when it grows: a broadcast, never a poll.
//
// A follower subscribes (takes a Source's channel) before it reads, then
// reads all there is, then waits on the channel: whatever is written between
// the read and the wait has closed the channel already, so nothing is lost
// in that gap. A writer only closes a channel, so a slow reader never holds
// one up.
package follow

import (
	"context"
	"reflect"
	"sync"
	"time"
)

// Broadcast is sync.Cond's Broadcast through a channel, so that a wait can
// also select on a context or a timer. The zero value is ready; a nil
// *Broadcast never wakes anyone.
type Broadcast struct {
	mu sync.Mutex
	ch chan struct{} // closed and dropped by the next Notify
}

// Wait returns a channel closed at the first Notify after the call.
func (b *Broadcast) Wait() <-chan struct{} {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch == nil {
		b.ch = make(chan struct{})
	}
	return b.ch
}

// Notify wakes every waiter; it never blocks.
func (b *Broadcast) Notify() {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch != nil {
		close(b.ch)
		b.ch = nil
	}
}

// A Source tells a follower that what it reads may have more: it returns a
// channel closed at the next change after the call (Broadcast.Wait, say).
// A nil channel is a source that never wakes.
type Source func() <-chan struct{}

// Follow calls read until read reports done or fails, or ctx ends (then it
// returns ctx's error). Between calls it waits for a change from one of
// sources, taken before each read so that a change during the read wakes
// the wait that follows it. read may ask to be called again at a time (to
// send a line held back, say) even if nothing changes; zero for never.
func Follow(ctx context.Context, read func() (done bool, again time.Time, err error), sources ...Source) error {
	cases := make([]reflect.SelectCase, len(sources)+2)
	for {
		cases[0] = reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())}
		for i, src := range sources {
			cases[i+1] = reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(src())}
		}
		done, again, err := read()
		if err != nil || done {
			return err
		}
		n := len(sources) + 1
		var timer *time.Timer
		if !again.IsZero() {
			timer = time.NewTimer(time.Until(again))
			cases[n] = reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(timer.C)}
			n++
		}
		chosen, _, _ := reflect.Select(cases[:n])
		if timer != nil {
			timer.Stop()
		}
		if chosen == 0 {
			return ctx.Err()
		}
	}
}
