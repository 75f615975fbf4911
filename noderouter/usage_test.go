package noderouter

import (
	"fmt"
	"testing"

	"skipper.dev/skipper/internal/poll"
	"skipper.dev/skipper/noderouter/cgroup"
	pb "skipper.dev/skipper/proto/skipperv1"
)

// TestReportsInstanceUsage: the reports carry the CPU and memory of the
// instances on the router's node, read from their cgroups (a testdata tree
// here), and nothing for instances elsewhere.
func TestReportsInstanceUsage(t *testing.T) {
	t.Parallel()
	const local = "5b0e0e0e-aaaa-bbbb-cccc-000000000002" // in cgroup/testdata/hybrid
	fake := startFakeController(t)
	remote := inst("remote", startEcho(t, "remote"))
	remote.Node = "node2"
	fake.handle("default/echo", fixed(1, inst(local, startEcho(t, local)), remote))
	reader, err := cgroup.Open("cgroup/testdata/hybrid", "/skipper")
	if err != nil {
		t.Fatal(err)
	}
	h := startRouter(t, fake, nil, func(rt *router) { rt.cp.usage.reader = reader })
	if r := h.call(t, "default/echo"); r.status != 200 {
		t.Fatalf("status %d", r.status)
	}
	var got map[string]*pb.InstanceReport
	poll.Until(t, pollTimeout, pollInterval, "a report with the local instance's CPU and memory", fake.holds(func(f *fakeController) error {
		n := len(f.reports)
		if n == 0 || len(f.reports[n-1].GetFunctions()) == 0 {
			return fmt.Errorf("%d reports, the last of no function", n)
		}
		got = map[string]*pb.InstanceReport{}
		for _, ir := range f.reports[n-1].GetFunctions()[0].GetInstances() {
			got[ir.GetPodUid()] = ir
		}
		// CPU needs two samples: the first has no delta.
		return poll.Unmet(got[local] != nil && got[local].CpuMillicores != nil, "the last report's instances: %v", got)
	}))
	if l := got[local]; l.GetCpuMillicores() != 0 || l.MemoryBytes == nil || l.GetMemoryBytes() != 16777216 {
		t.Errorf("local instance: cpu %v memory %v; want 0 millicores (a static tree) and 16777216 bytes", l.CpuMillicores, l.MemoryBytes)
	}
	if r := got["remote"]; r == nil || r.CpuMillicores != nil || r.MemoryBytes != nil {
		t.Errorf("instance on another node: %v; want it reported without cpu or memory", r)
	}
}
