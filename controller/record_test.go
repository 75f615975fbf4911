package controller

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestDoubling(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name      string
		base, max time.Duration
		want      []time.Duration // the first Steps
	}{
		{name: "doubles up to max, then stays", base: 50 * ms, max: 300 * ms, want: []time.Duration{50 * ms, 100 * ms, 200 * ms, 300 * ms, 300 * ms}},
		{name: "a base above max is max", base: 2 * time.Minute, max: time.Minute, want: []time.Duration{time.Minute, time.Minute}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := doubling(tt.base, tt.max)
			var got []time.Duration
			for range tt.want {
				got = append(got, b.Step())
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("steps (-want +got):\n%s", diff)
			}
		})
	}
}
