package skipperv1

import "math"

// ClampUint32 is n for a message's uint32 count (a report's or a state's
// InFlight and Queued, kept as int64 by both sides): below zero (counters
// racing) it is 0, past the field's range math.MaxUint32. The one clamp of
// the router and the controller.
func ClampUint32(n int64) uint32 { return uint32(min(max(n, 0), math.MaxUint32)) }
