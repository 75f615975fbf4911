package noderouter

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"skipper.dev/skipper/internal/tick"
	"skipper.dev/skipper/noderouter/cgroup"
	"skipper.dev/skipper/noderouter/route"
)

// usageReader samples one pod's cgroup (*cgroup.Reader).
type usageReader interface {
	Read(uid string, now time.Time) (cgroup.Usage, error)
}

var _ usageReader = (*cgroup.Reader)(nil)

// instanceUsage is what a report says of one local instance's resources.
type instanceUsage struct {
	cpuMillicores uint64
	hasCPU        bool
	memoryBytes   uint64
	hasMemory     bool
}

// usageSampler reads the cgroups of the cached instances on this node once
// per report interval and keeps the latest figures for the reports: CPU in
// millicores from the usage delta since the previous sample, memory as the
// working set. Instances on other nodes are never read.
type usageSampler struct {
	reader usageReader // nil: off
	node   string
	cache  *route.Cache
	log    *slog.Logger

	prev map[string]cpuSample // owned by run
	snap atomic.Pointer[map[string]instanceUsage]
}

type cpuSample struct {
	usage time.Duration
	at    time.Time
}

// get returns the latest figures of the instance with pod uid.
func (s *usageSampler) get(uid string) (instanceUsage, bool) {
	if s == nil {
		return instanceUsage{}, false
	}
	m := s.snap.Load()
	if m == nil {
		return instanceUsage{}, false
	}
	u, ok := (*m)[uid]
	return u, ok
}

// run samples every interval until ctx ends.
func (s *usageSampler) run(ctx context.Context, interval time.Duration) {
	tick.Every(ctx, interval, s.sample)
}

// sample reads every local instance once and publishes the figures.
func (s *usageSampler) sample(now time.Time) {
	if s.prev == nil {
		s.prev = map[string]cpuSample{}
	}
	next := map[string]instanceUsage{}
	seen := map[string]bool{}
	for _, e := range s.cache.Entries() {
		a := e.Assignment()
		if a == nil {
			continue
		}
		for _, in := range a.Instances {
			if in.Node != s.node || seen[in.PodUID] {
				continue
			}
			seen[in.PodUID] = true
			u, err := s.reader.Read(in.PodUID, now)
			if err != nil && !errors.Is(err, cgroup.ErrPodNotFound) {
				s.log.Debug("read instance cgroup", "pod", in.Pod, "err", err)
			}
			var iu instanceUsage
			if u.HasCPU {
				if p, ok := s.prev[in.PodUID]; ok {
					iu.cpuMillicores, iu.hasCPU = cgroup.Millicores(p.usage, u.CPU, now.Sub(p.at))
				}
				s.prev[in.PodUID] = cpuSample{usage: u.CPU, at: now}
			}
			iu.memoryBytes, iu.hasMemory = u.Memory, u.HasMemory
			if iu.hasCPU || iu.hasMemory {
				next[in.PodUID] = iu
			}
		}
	}
	for uid := range s.prev {
		if !seen[uid] {
			delete(s.prev, uid)
		}
	}
	s.snap.Store(&next)
}
