package skipperv1

import (
	"math"
	"testing"
)

func TestClampUint32(t *testing.T) {
	tests := []struct {
		name string
		n    int64
		want uint32
	}{
		{"in range", 7, 7},
		{"zero", 0, 0},
		{"negative", -3, 0},
		{"the largest", math.MaxUint32, math.MaxUint32},
		{"past the range", math.MaxUint32 + 1, math.MaxUint32},
		{"int64's largest", math.MaxInt64, math.MaxUint32},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ClampUint32(tt.n); got != tt.want {
				t.Errorf("ClampUint32(%d) = %d, want %d", tt.n, got, tt.want)
			}
		})
	}
}
