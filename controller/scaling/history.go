package scaling

import "time"

// historySize bounds the History: the most distinct descending steps one
// stabilization window remembers exactly.
const historySize = 16

// History is the recommendations a stabilization window needs, as a value
// the caller keeps between calls (the zero value is empty). It holds a
// monotonic queue: times increase and recommendations strictly decrease from
// the oldest entry to the newest, so the oldest entry still in the window is
// the window's highest recommendation. Entries a later, higher or equal
// recommendation dominates are dropped; when more than historySize
// descending steps fall in one window, the two newest entries merge into one
// that keeps the higher value until the later time, which holds a scale-down
// longer than HPA would, never shorter.
type History struct {
	entries [historySize]historyEntry
	first   uint8 // index of the oldest entry
	n       uint8 // entries in use
}

type historyEntry struct {
	at  int64 // Unix nanoseconds
	rec int32
}

// Len reports how many entries the History holds.
func (h *History) Len() int { return int(h.n) }

// Highest returns the highest recommendation recorded after now-window, and
// false if there is none.
func (h *History) Highest(now time.Time, window time.Duration) (int32, bool) {
	cutoff := now.Add(-window).UnixNano()
	for i := uint8(0); i < h.n; i++ {
		if e := h.at(i); e.at > cutoff {
			return e.rec, true
		}
	}
	return 0, false
}

func (h *History) at(i uint8) historyEntry { return h.entries[(h.first+i)%historySize] }

func (h *History) back() *historyEntry { return &h.entries[(h.first+h.n-1)%historySize] }

// record adds rec at now and returns the highest recommendation within the
// window ending at now, rec included (HPA keeps entries whose time is after
// now-window).
func (h *History) record(now time.Time, rec int32, window time.Duration) int32 {
	at, cutoff := now.UnixNano(), now.Add(-window).UnixNano()
	for h.n > 0 && h.entries[h.first].at <= cutoff {
		h.first = (h.first + 1) % historySize
		h.n--
	}
	for h.n > 0 && h.back().rec <= rec {
		h.n--
	}
	if h.n > 0 && h.back().at > at {
		// The clock went backwards: keep the later time so the window never
		// shrinks.
		at = h.back().at
	}
	if h.n == historySize {
		// Merge the two newest: the older (higher) value until the newer time.
		last := *h.back()
		h.n--
		h.back().at = last.at
	}
	h.entries[(h.first+h.n)%historySize] = historyEntry{at: at, rec: rec}
	h.n++
	if h.n == 1 {
		return rec
	}
	return h.entries[h.first].rec
}
