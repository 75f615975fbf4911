package assign

import (
	"fmt"
	"time"
)

// DefaultMaxUsed bounds the ids an instance remembers. A token lives a
// minute (the controller's lifetime), and an instance is assigned a
// handful of times in that (a retry, a callers change), so the bound is
// only reached by a controller gone wrong.
const DefaultMaxUsed = 1024

// Used remembers the ids of the tokens an instance accepted, each until
// its token expires: after that Verify refuses the token anyway, so the
// id is forgotten. It holds at most max ids; when full, it refuses new
// ones (ErrTooMany) rather than forget one that could still be replayed.
// Its zero value is not usable (NewUsed); it is not safe for concurrent
// use.
type Used struct {
	max    int
	expiry map[string]int64 // id → the token's Expiry, Unix seconds
}

// NewUsed returns a Used holding at most max ids (DefaultMaxUsed when
// max ≤ 0).
func NewUsed(max int) *Used {
	if max <= 0 {
		max = DefaultMaxUsed
	}
	return &Used{max: max, expiry: map[string]int64{}}
}

// Use records c.ID, from a token VerifyRequest accepted at now. It returns
// ErrReplayed when the id was used before, and ErrTooMany when max
// unexpired ids are held; either way nothing is recorded.
func (u *Used) Use(c Claims, now time.Time) error {
	if exp, ok := u.expiry[c.ID]; ok && now.Unix() < exp {
		return fmt.Errorf("%w: id %s", ErrReplayed, c.ID)
	}
	if len(u.expiry) >= u.max {
		u.prune(now)
		if len(u.expiry) >= u.max {
			return fmt.Errorf("%w: %d unexpired", ErrTooMany, len(u.expiry))
		}
	}
	u.expiry[c.ID] = c.Expiry
	return nil
}

// Len is the number of ids held, expired ones not yet pruned included.
func (u *Used) Len() int { return len(u.expiry) }

// prune forgets the ids whose tokens expired at now.
func (u *Used) prune(now time.Time) {
	for id, exp := range u.expiry {
		if now.Unix() >= exp {
			delete(u.expiry, id)
		}
	}
}
