// Package flagenv gives a flag.FlagSet's flags environment variables to fall
// back on, the one way every Skipper binary reads its SKIPPER_* variables.
//
// A caller defines its flags on a flag.FlagSet as usual, names each flag's
// variables in a Vars (Names gives every flag its SKIPPER_<FLAG> variable,
// followed by any others, such as the downward API's POD_NAME), and calls
// Parse with the command line and a lookup function: package os's
// LookupEnv, passed down from main, or Map's lookup over a map in tests.
// The package reads no environment of its own and imports only the
// standard library, so the router and the controller may both use it.
//
// Parse's rules, the same for every binary:
//   - a flag on the command line wins, and its variables are not read;
//   - otherwise the first of its variables set to a non-empty value is used
//     (an empty variable counts as unset, as a Kubernetes env entry from an
//     absent field or optional key is empty), the flag's default if none is;
//   - a variable's value goes through the flag's own parser, and a value the
//     parser refuses is an error naming the variable and the flag, never
//     dropped for the default;
//   - --help is answered before any variable is read, so the usage never
//     depends on the environment;
//   - arguments left after the flags are an error.
//
// After Parse, fs.Visit visits the flags set either way, so a caller that
// derives defaults from which flags were given sees the environment too.
// PrintFlags writes the flag list of a --help in the form the binaries share.
package flagenv
