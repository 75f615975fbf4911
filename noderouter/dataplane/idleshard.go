package dataplane

import "time"

// idleConn is a connection to an instance that an idleShard can hold: it
// says since when it has been idle.
type idleConn interface {
	comparable
	idleSince() time.Time
}

// idleShard is the router's instance pool, one shard of it: idle
// keep-alive connections to instances, last in first out per instance
// address, so that the connection used last (warm in every cache) goes out
// first and the oldest age out when a function needs fewer. It is plain
// data and not safe for concurrent use: each event loop owns a shard of
// its own (lock-free, its own sockets), and upstreamPool guards the shard
// the h1 path and pre-connections share with a mutex. Connections a call
// lets go (too old, the shard closing) go to drop: the shard has
// forgotten them by then, and drop must not call the shard.
type idleShard[C idleConn] struct {
	by map[string][]C
	n  int // connections held
}

// take returns the connection to addr idled last, if one younger than ttl
// is held; older ones met on the way are dropped.
func (s *idleShard[C]) take(addr string, now time.Time, ttl time.Duration, drop func(C)) (C, bool) {
	list := s.by[addr]
	for len(list) > 0 {
		c := list[len(list)-1]
		var zero C
		list[len(list)-1] = zero
		list = list[:len(list)-1]
		s.n--
		// An emptied list stays, its array for the next put (a warm
		// request takes and puts one connection each: no allocation);
		// sweep deletes it once it is still empty.
		s.by[addr] = list
		if now.Sub(c.idleSince()) < ttl {
			return c, true
		}
		drop(c)
	}
	var zero C
	return zero, false
}

// put keeps c, idle now, for addr; false (c not kept) when max
// connections to addr are held already.
func (s *idleShard[C]) put(addr string, c C, max int) bool {
	list := s.by[addr]
	if len(list) >= max {
		return false
	}
	if s.by == nil {
		s.by = make(map[string][]C)
	}
	s.by[addr] = append(list, c)
	s.n++
	return true
}

// remove forgets c, held for addr (closed while idle); false when it is
// not held.
func (s *idleShard[C]) remove(addr string, c C) bool {
	list := s.by[addr]
	for i, o := range list {
		if o == c {
			copy(list[i:], list[i+1:])
			var zero C
			list[len(list)-1] = zero
			s.n--
			s.set(addr, list[:len(list)-1])
			return true
		}
	}
	return false
}

// sweep drops the connections idle for ttl or longer (all of them when
// all is set: the pool closing). The oldest sit at the front of each
// address's list.
func (s *idleShard[C]) sweep(now time.Time, ttl time.Duration, all bool, drop func(C)) {
	var stale []C
	for addr, list := range s.by {
		if len(list) == 0 {
			delete(s.by, addr)
			continue
		}
		n := len(list)
		if !all {
			n = 0
			for n < len(list) && now.Sub(list[n].idleSince()) >= ttl {
				n++
			}
		}
		if n == 0 {
			continue
		}
		stale = append(stale, list[:n]...)
		rest := append(list[:0], list[n:]...)
		clear(list[len(rest):])
		s.n -= n
		s.set(addr, rest)
	}
	for _, c := range stale {
		drop(c)
	}
}

// count is the number of connections held for addr.
func (s *idleShard[C]) count(addr string) int { return len(s.by[addr]) }

// len is the number of connections held.
func (s *idleShard[C]) len() int { return s.n }

// set stores addr's list, deleting the key when it is empty.
func (s *idleShard[C]) set(addr string, list []C) {
	if len(list) == 0 {
		delete(s.by, addr)
		return
	}
	s.by[addr] = list
}
