// Package agent is skipper-agent: the instance contract
// (controller/instance) for an application that knows nothing of Skipper,
// run beside it in each pool pod as a native sidecar (an init container
// with restartPolicy Always) whose container port is named
// skipper-assign. The controller assigns, asks and pre-connects there;
// calls go straight to the application's own port, never through the
// agent.
//
// An accepted assignment is handed to the application before the assign
// is answered: written whole to files under --dir, a volume both
// containers mount (function, config.json, and assignment.json last),
// then POSTed as JSON to its hook when --hook names one. A non-2xx answer
// refuses the claim, and the files go back to what the application held. The application sees each call's caller in
// X-Skipper-Caller, but nothing makes it check the function's callers:
// a pool serving functions with callers needs the NetworkPolicy
// (docs/security.md).
package agent
