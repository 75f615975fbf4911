package ring

import (
	"errors"
	"slices"
	"strconv"

	"github.com/cespare/xxhash/v2"
)

// VirtualNodes is the number of points each member holds on the ring.
const VirtualNodes = 1024

// ErrEmpty is returned when a ring is built from no members.
var ErrEmpty = errors.New("ring has no members")

type point struct {
	hash   uint64
	member int32 // index into members
}

// Ring maps keys to members. The zero value is not usable; build with New.
type Ring struct {
	members []string
	points  []point
	epoch   uint64
}

// New builds a ring from members. Duplicates and empty strings are dropped;
// order does not matter.
func New(members []string) (*Ring, error) {
	ms := make([]string, 0, len(members))
	for _, m := range members {
		if m != "" {
			ms = append(ms, m)
		}
	}
	slices.Sort(ms)
	ms = slices.Compact(ms)
	if len(ms) == 0 {
		return nil, ErrEmpty
	}
	r := &Ring{members: ms, points: make([]point, 0, len(ms)*VirtualNodes), epoch: Epoch(ms)}
	buf := make([]byte, 0, 64)
	for i, m := range ms {
		for v := range VirtualNodes {
			buf = append(buf[:0], m...)
			buf = append(buf, '#')
			buf = strconv.AppendInt(buf, int64(v), 10)
			r.points = append(r.points, point{hash: xxhash.Sum64(buf), member: int32(i)})
		}
	}
	slices.SortFunc(r.points, func(a, b point) int {
		switch {
		case a.hash < b.hash:
			return -1
		case a.hash > b.hash:
			return 1
		}
		// Ties (vanishingly rare) broken by member so every builder agrees.
		return int(a.member - b.member)
	})
	return r, nil
}

// Owner returns the member that owns key.
func (r *Ring) Owner(key string) string {
	h := xxhash.Sum64String(key)
	i, _ := slices.BinarySearchFunc(r.points, h, func(p point, h uint64) int {
		switch {
		case p.hash < h:
			return -1
		case p.hash > h:
			return 1
		}
		return 0
	})
	if i == len(r.points) {
		i = 0
	}
	return r.members[r.points[i].member]
}

// Members returns the sorted member set. The caller must not modify it.
func (r *Ring) Members() []string { return r.members }

// Len returns the number of members.
func (r *Ring) Len() int { return len(r.members) }

// Has reports whether member is on the ring.
func (r *Ring) Has(member string) bool {
	_, ok := slices.BinarySearch(r.members, member)
	return ok
}

// Epoch identifies the member set: equal sets give equal epochs.
func (r *Ring) Epoch() uint64 { return r.epoch }

// Epoch returns the epoch of a sorted, de-duplicated member set.
func Epoch(sorted []string) uint64 {
	d := xxhash.New()
	for _, m := range sorted {
		_, _ = d.WriteString(m)
		_, _ = d.Write([]byte{0})
	}
	return d.Sum64()
}
