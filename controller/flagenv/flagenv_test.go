package flagenv

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// values is what testFlags' flags hold.
type values struct {
	Name  string
	Wait  time.Duration
	Count int
	On    bool
}

// testFlags defines one flag of each kind the binaries use, with the
// variables of each: name falls back on SKIPPER_NAME, then POD_NAME.
func testFlags(v *values) (*flag.FlagSet, Vars) {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&v.Name, "name", "default", "a name")
	fs.DurationVar(&v.Wait, "wait", time.Second, "a wait")
	fs.IntVar(&v.Count, "count", 3, "a count")
	fs.BoolVar(&v.On, "on", false, "a switch")
	return fs, Names(fs, Vars{"name": {"POD_NAME"}})
}

func TestParse(t *testing.T) {
	t.Parallel()
	def := values{Name: "default", Wait: time.Second, Count: 3}
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    values
		wantSet []string // flags fs.Visit visits afterwards
		wantErr []string // substrings of the error, all required
	}{
		{name: "unset: defaults", want: def},
		{name: "other variables are not read", env: map[string]string{"NAME": "x", "SKIPPER_NAMES": "y"}, want: def},
		{
			name:    "environment over defaults, through each flag's parser",
			env:     map[string]string{"SKIPPER_NAME": "env", "SKIPPER_WAIT": "250ms", "SKIPPER_COUNT": "7", "SKIPPER_ON": "true"},
			want:    values{Name: "env", Wait: 250 * time.Millisecond, Count: 7, On: true},
			wantSet: []string{"count", "name", "on", "wait"},
		},
		{
			name:    "command line over environment",
			args:    []string{"--name=flag", "--wait", "2s"},
			env:     map[string]string{"SKIPPER_NAME": "env", "POD_NAME": "pod", "SKIPPER_WAIT": "250ms", "SKIPPER_COUNT": "7"},
			want:    values{Name: "flag", Wait: 2 * time.Second, Count: 7},
			wantSet: []string{"count", "name", "wait"},
		},
		{
			name:    "command line over environment, even to the default value",
			args:    []string{"--count=3", "--name="},
			env:     map[string]string{"SKIPPER_COUNT": "7", "SKIPPER_NAME": "env"},
			want:    values{Name: "", Wait: time.Second, Count: 3},
			wantSet: []string{"count", "name"},
		},
		{
			name:    "first variable over later ones",
			env:     map[string]string{"SKIPPER_NAME": "skipper", "POD_NAME": "pod"},
			want:    values{Name: "skipper", Wait: time.Second, Count: 3},
			wantSet: []string{"name"},
		},
		{
			name:    "a later variable when the first is unset",
			env:     map[string]string{"POD_NAME": "pod"},
			want:    values{Name: "pod", Wait: time.Second, Count: 3},
			wantSet: []string{"name"},
		},
		{
			name:    "empty counts as unset: a later variable",
			env:     map[string]string{"SKIPPER_NAME": "", "POD_NAME": "pod"},
			want:    values{Name: "pod", Wait: time.Second, Count: 3},
			wantSet: []string{"name"},
		},
		{
			name: "empty counts as unset: the default",
			env:  map[string]string{"SKIPPER_NAME": "", "POD_NAME": "", "SKIPPER_WAIT": "", "SKIPPER_COUNT": ""},
			want: def,
		},
		{
			name:    "a bad value is an error naming the variable and the flag",
			env:     map[string]string{"SKIPPER_WAIT": "soon"},
			wantErr: []string{`invalid value "soon" for flag --wait from SKIPPER_WAIT`},
		},
		{
			name: "every bad value at once",
			env:  map[string]string{"SKIPPER_WAIT": "soon", "SKIPPER_COUNT": "many", "SKIPPER_ON": "maybe"},
			wantErr: []string{`"soon" for flag --wait from SKIPPER_WAIT`, `"many" for flag --count from SKIPPER_COUNT`,
				`"maybe" for flag --on from SKIPPER_ON`},
		},
		{
			name: "a bad variable shadowed by its flag is not read",
			args: []string{"--wait=2s"},
			env:  map[string]string{"SKIPPER_WAIT": "soon"},
			want: values{Name: "default", Wait: 2 * time.Second, Count: 3}, wantSet: []string{"wait"},
		},
		{name: "a bad flag", args: []string{"--count=many"}, wantErr: []string{`invalid value "many" for flag -count`}},
		{name: "an unknown flag", args: []string{"--nope"}, wantErr: []string{"flag provided but not defined: -nope"}},
		{
			name:    "arguments after the flags, with a bad variable",
			args:    []string{"--on", "extra", "--count=1"},
			env:     map[string]string{"SKIPPER_WAIT": "soon"},
			wantErr: []string{`unexpected arguments: ["extra" "--count=1"]`, "SKIPPER_WAIT"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var got values
			fs, vars := testFlags(&got)
			err := Parse(fs, vars, tt.args, Map(tt.env))
			if tt.wantErr != nil {
				if err == nil {
					t.Fatalf("Parse = nil, want an error; values %+v", got)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("values (-want +got):\n%s", diff)
			}
			var set []string
			fs.Visit(func(f *flag.Flag) { set = append(set, f.Name) })
			if diff := cmp.Diff(tt.wantSet, set); diff != "" {
				t.Errorf("flags set (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseHelpReadsNoVariable(t *testing.T) {
	t.Parallel()
	var v values
	fs, vars := testFlags(&v)
	err := Parse(fs, vars, []string{"--help"}, func(k string) (string, bool) {
		t.Errorf("getenv(%q) during --help", k)
		return "soon", true
	})
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("Parse(--help) = %v, want flag.ErrHelp", err)
	}
}

func TestParsePanicsOnVariablesOfNoFlag(t *testing.T) {
	t.Parallel()
	var v values
	fs, vars := testFlags(&v)
	vars["nmae"] = []string{"SKIPPER_NMAE"}
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), "--nmae") {
			t.Errorf("recover() = %v, want a panic naming --nmae", r)
		}
	}()
	_ = Parse(fs, vars, nil, Map(nil))
}

func TestName(t *testing.T) {
	t.Parallel()
	for flagName, want := range map[string]string{
		"listen":                      "SKIPPER_LISTEN",
		"pod-name":                    "SKIPPER_POD_NAME",
		"grpc-max-concurrent-streams": "SKIPPER_GRPC_MAX_CONCURRENT_STREAMS",
	} {
		if got := Name(flagName); got != want {
			t.Errorf("Name(%q) = %q, want %q", flagName, got, want)
		}
	}
}

func TestNames(t *testing.T) {
	t.Parallel()
	var v values
	_, got := testFlags(&v)
	want := Vars{
		"name":  {"SKIPPER_NAME", "POD_NAME"},
		"wait":  {"SKIPPER_WAIT"},
		"count": {"SKIPPER_COUNT"},
		"on":    {"SKIPPER_ON"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Names (-want +got):\n%s", diff)
	}
}

func TestPrintFlags(t *testing.T) {
	t.Parallel()
	var v values
	fs, vars := testFlags(&v)
	delete(vars, "on")
	var out bytes.Buffer
	PrintFlags(&out, fs, vars)
	want := `  --count
        a count
        default "3"; env SKIPPER_COUNT
  --name
        a name
        default "default"; env SKIPPER_NAME, POD_NAME
  --on
        a switch
        default "false"
  --wait
        a wait
        default "1s"; env SKIPPER_WAIT
`
	if diff := cmp.Diff(want, out.String()); diff != "" {
		t.Errorf("PrintFlags (-want +got):\n%s", diff)
	}
}
