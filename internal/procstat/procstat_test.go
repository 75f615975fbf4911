package procstat

import (
	"testing"
	"time"
)

func TestParseStatm(t *testing.T) {
	for _, tc := range []struct {
		name    string
		statm   string
		want    uint64
		wantErr bool
	}{
		{name: "resident pages", statm: "311402 5379 2931 1203 0 84325 0\n", want: 5379 * 4096},
		{name: "empty", statm: "", wantErr: true},
		{name: "one field", statm: "311402\n", wantErr: true},
		{name: "not a number", statm: "311402 x 2931\n", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseStatm(tc.statm, 4096)
			if (err != nil) != tc.wantErr {
				t.Fatalf("parseStatm(%q) error %v, want error %v", tc.statm, err, tc.wantErr)
			}
			if got != tc.want {
				t.Errorf("parseStatm(%q) = %d, want %d", tc.statm, got, tc.want)
			}
		})
	}
}

func TestResidentAndCPUTime(t *testing.T) {
	rss, err := Resident()
	if err != nil {
		t.Fatal(err)
	}
	if rss < 1<<20 {
		t.Errorf("resident set %d bytes, want at least 1 MiB for a Go test binary", rss)
	}
	before, err := CPUTime()
	if err != nil {
		t.Fatal(err)
	}
	// Spin until the kernel has charged CPU time (its accounting is in
	// ticks), bounded so a broken counter fails rather than hangs.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		after, err := CPUTime()
		if err != nil {
			t.Fatal(err)
		}
		if after > before {
			return
		}
	}
	t.Errorf("CPU time stayed at %v over 5 s of spinning", before)
}
