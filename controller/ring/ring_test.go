package ring

import (
	"errors"
	"fmt"
	"math"
	"testing"
)

func TestNewEmpty(t *testing.T) {
	t.Parallel()
	for _, ms := range [][]string{nil, {}, {""}} {
		if _, err := New(ms); !errors.Is(err, ErrEmpty) {
			t.Fatalf("New(%q) error = %v, want ErrEmpty", ms, err)
		}
	}
}

func TestOrderAndDuplicatesDoNotMatter(t *testing.T) {
	t.Parallel()
	a, _ := New([]string{"10.0.0.1:9090", "10.0.0.2:9090", "10.0.0.3:9090"})
	b, _ := New([]string{"10.0.0.3:9090", "10.0.0.1:9090", "10.0.0.2:9090", "10.0.0.1:9090"})
	if a.Epoch() != b.Epoch() {
		t.Fatal("epochs differ for the same member set")
	}
	for i := range 1000 {
		k := fmt.Sprintf("ns/fn-%d", i)
		if a.Owner(k) != b.Owner(k) {
			t.Fatalf("owner of %s differs", k)
		}
	}
	c, _ := New([]string{"10.0.0.1:9090", "10.0.0.2:9090"})
	if c.Epoch() == a.Epoch() {
		t.Fatal("different member sets share an epoch")
	}
}

func members(n int) []string {
	ms := make([]string, n)
	for i := range ms {
		ms[i] = fmt.Sprintf("198.18.%d.%d:9090", i/200, i%200+10)
	}
	return ms
}

func TestDistribution(t *testing.T) {
	t.Parallel()
	const keys = 100_000
	for _, n := range []int{3, 10} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			r, err := New(members(n))
			if err != nil {
				t.Fatal(err)
			}
			counts := map[string]int{}
			for i := range keys {
				counts[r.Owner(fmt.Sprintf("namespace-%d/function-%d", i%37, i))]++
			}
			even := float64(keys) / float64(n)
			for m, c := range counts {
				if dev := math.Abs(float64(c)-even) / even; dev > 0.10 {
					t.Errorf("member %s owns %d keys, %.1f%% off even %f", m, c, dev*100, even)
				}
			}
			if len(counts) != n {
				t.Errorf("%d of %d members own keys", len(counts), n)
			}
		})
	}
}

func TestMovementOnMemberChange(t *testing.T) {
	t.Parallel()
	const keys = 100_000
	for _, n := range []int{3, 10} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			before, _ := New(members(n))
			after, _ := New(members(n + 1))
			moved := 0
			for i := range keys {
				k := fmt.Sprintf("ns/f-%d", i)
				if before.Owner(k) != after.Owner(k) {
					moved++
				}
			}
			// Adding one member should move about 1/(n+1) of the keys, all of them
			// to the new member.
			want := float64(keys) / float64(n+1)
			if got := float64(moved); math.Abs(got-want)/want > 0.15 {
				t.Errorf("moved %d keys, want ≈%.0f", moved, want)
			}
		})
	}
}

func BenchmarkOwner(b *testing.B) {
	r, _ := New(members(10))
	b.ReportAllocs()
	for b.Loop() {
		_ = r.Owner("default/echo")
	}
}
