// Package cmdmain is the main function of Skipper's commands: each
// command's package exports a Run taking its context, arguments,
// environment lookup and stderr, and its main is one call to Main.
package cmdmain
