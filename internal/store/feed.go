package store

import "sbx.dev/sbx/internal/follow"

// feed tells followers that the store recorded an event. Every change of a
// sandbox's state (its creation, a transition, its deletion) records one, so
// a follower that re-reads the sandboxes when told misses no state.
type feed = follow.Broadcast

// Changed returns a channel that is closed once an event is recorded (and
// committed) after the call: a sandbox was created, changed state or was
// deleted. Changes coalesce; a follower re-reads what it follows when the
// channel closes, then calls Changed again before it reads, or it may miss
// one.
func (s *Store) Changed() <-chan struct{} { return s.feed.Wait() }
