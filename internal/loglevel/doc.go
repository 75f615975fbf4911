// Package loglevel parses the --log-level of every Skipper binary: the one
// parser the controller's and the router's Validate and Run share. It
// imports only the standard library, so both may use it.
package loglevel
