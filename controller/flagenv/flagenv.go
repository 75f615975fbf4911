package flagenv

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// Prefix starts every variable Name derives from a flag.
const Prefix = "SKIPPER_"

// Vars maps a flag's name to the environment variables it falls back on, in
// the order they are read.
type Vars map[string][]string

// Name returns the variable that backs a flag by convention: Prefix and the
// flag's name upper-cased, dashes as underscores (pod-name:
// SKIPPER_POD_NAME).
func Name(flagName string) string {
	return Prefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Names gives every flag defined on fs its Name, followed by extra's
// variables for it. Call it once all flags are defined.
func Names(fs *flag.FlagSet, extra Vars) Vars {
	v := Vars{}
	fs.VisitAll(func(f *flag.Flag) {
		v[f.Name] = append([]string{Name(f.Name)}, extra[f.Name]...)
	})
	return v
}

// Map returns a lookup over m with the signature of package os's LookupEnv:
// the environment tests pass to Parse.
func Map(m map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := m[name]
		return v, ok
	}
}

// Parse parses args into fs, then sets each flag that args (or an earlier
// fs.Set) left unset from the first of its variables that getenv finds
// non-empty, through fs.Set. getenv has the signature of package os's
// LookupEnv. On --help it returns flag.ErrHelp without reading any
// variable; the caller writes the usage. Bad values in the environment are all reported, joined, each
// naming its variable and flag; so are arguments left after the flags.
//
// Parse panics if vars names a flag fs does not define: a programming
// error, as defining a flag twice is for package flag.
func Parse(fs *flag.FlagSet, vars Vars, args []string, getenv func(string) (string, bool)) error {
	for name := range vars {
		if fs.Lookup(name) == nil {
			panic(fmt.Sprintf("flagenv: variables %v for flag --%s, which %s does not define", vars[name], name, fs.Name()))
		}
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] {
			return
		}
		for _, name := range vars[f.Name] {
			v, ok := getenv(name)
			if !ok || v == "" {
				continue
			}
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("invalid value %q for flag --%s from %s: %w", v, f.Name, name, err))
			}
			return
		}
	})
	if fs.NArg() > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments: %q", fs.Args()))
	}
	return errors.Join(errs...)
}

// PrintFlags writes every flag of fs in lexical order as three lines: the
// flag indented by two spaces, then its usage and its default with its
// variables from vars indented by eight:
//
//	--listen
//	      address to serve on
//	      default ":8080"; env SKIPPER_LISTEN
//
// A flag without variables ends at its default.
func PrintFlags(w io.Writer, fs *flag.FlagSet, vars Vars) {
	fs.VisitAll(func(f *flag.Flag) {
		fmt.Fprintf(w, "  --%s\n        %s\n        default %q", f.Name, f.Usage, f.DefValue)
		if v := vars[f.Name]; len(v) > 0 {
			fmt.Fprintf(w, "; env %s", strings.Join(v, ", "))
		}
		fmt.Fprintln(w)
	})
}
