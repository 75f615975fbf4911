package nodeagent

import (
	"testing"
	"time"
)

func TestEagerWait(t *testing.T) {
	ms := time.Millisecond
	var got []time.Duration
	eager := 10 * ms
	for range 8 {
		var w time.Duration
		w, eager = eagerWait(time.Second, 500*ms, eager)
		got = append(got, w)
	}
	want := []time.Duration{10 * ms, 20 * ms, 40 * ms, 80 * ms, 160 * ms, 320 * ms, 500 * ms, 500 * ms}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("eager waits %v, want %v", got, want)
		}
	}
	// Never above the probe's period, never zero, and no overflow however
	// long a container stays unready.
	eager = 10 * ms
	for i := range 200 {
		var w time.Duration
		w, eager = eagerWait(100*ms, 500*ms, eager)
		if w <= 0 || w > 100*ms {
			t.Fatalf("wait %d = %s, want within (0, 100ms]", i, w)
		}
	}
	if w, _ := eagerWait(time.Second, 500*ms, 0); w != ms {
		t.Errorf("zero eager interval waits %s, want 1ms", w)
	}
}
