package dataplane

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"skipper.dev/skipper/noderouter/route"
)

// StatusClientClosed is the code label of requests whose caller went away
// before an answer (nginx's 499); nothing is written to the caller.
const StatusClientClosed = 499

// retryAfter is the Retry-After value, in seconds, of retryable 503s.
const retryAfter = "1"

// Reasons in JSON error bodies: stable, machine-readable.
const (
	ReasonMissingFunction   = "missing_function"
	ReasonMalformedFunction = "malformed_function"
	ReasonUnknownFunction   = "unknown_function"
	ReasonNoCapacity        = "no_capacity"
	ReasonColdStartTimeout  = "cold_start_timeout"
	ReasonNoController      = "controller_unavailable"
	ReasonControllerError   = "controller_error"
	ReasonNoInstances       = "no_instances"
	ReasonUpstreamError     = "upstream_error"
	ReasonUpstreamTimeout   = "upstream_timeout"
	ReasonClientClosed      = "client_closed"
	ReasonQueueFull         = "queue_full"
	ReasonQueueTimeout      = "queue_timeout"
	ReasonBodyTooLarge      = "body_too_large"
	ReasonRouterOverloaded  = "router_overloaded"
	ReasonBadConnection     = "bad_connection_header"
	ReasonBadBody           = "malformed_body"
)

// errBadBody is a request body that breaks its framing (a chunk size
// that overflows, a broken chunk): the caller's fault, a 400, never
// retried. Its head may have gone to the instance: that connection is
// closed.
var errBadBody = errors.New("malformed request body")

// rejectReasons are the answers of limits, counted in
// skipper_noderouter_rejected_total{reason} (all initialised at 0).
var rejectReasons = []string{ReasonRouterOverloaded, ReasonBodyTooLarge, ReasonQueueFull, ReasonCallerUnknown, ReasonCallerDenied, ReasonBadConnection}

// answer is an error response the router writes itself.
type answer struct {
	status     int
	reason     string
	msg        string
	retryAfter bool
	// known: the function exists (label metrics with it).
	known bool
}

// Results of skipper_noderouter_get_instance_total (ControllerResult),
// all initialised at 0 (ControllerResults).
const (
	ResultOK                = "ok"
	ResultNotFound          = "not_found"
	ResultInvalidArgument   = "invalid_argument"
	ResultResourceExhausted = "resource_exhausted"
	ResultDeadlineExceeded  = "deadline_exceeded"
	ResultUnavailable       = "unavailable"
	ResultCallerRefused     = "caller_refused"
	ResultError             = "error"
)

var ControllerResults = []string{ResultOK, ResultNotFound, ResultInvalidArgument, ResultResourceExhausted, ResultDeadlineExceeded, ResultUnavailable, ResultCallerRefused, ResultError}

// parseAnswer maps a name-parsing error to its answer.
func parseAnswer(err error) answer {
	if errors.Is(err, route.ErrNoFunction) {
		return answer{status: http.StatusBadRequest, reason: ReasonMissingFunction,
			msg: "name the function with header x-skipper-function: <namespace>/<name>, or call it by its Service's name (<name>.<namespace>.svc, <name>.<namespace>) or Host: <name>.<namespace>.fn"}
	}
	return answer{status: http.StatusBadRequest, reason: ReasonMalformedFunction, msg: err.Error()}
}

// controllerAnswer maps an error of a GetInstance call to its answer and
// the get_instance_total result. This is the one place gRPC codes become
// HTTP statuses.
func controllerAnswer(err error) (answer, string) {
	if errors.Is(err, context.Canceled) {
		return answer{status: StatusClientClosed, reason: ReasonClientClosed, msg: "caller went away"}, ResultError
	}
	st, _ := status.FromError(err)
	msg := st.Message()
	switch st.Code() {
	case codes.NotFound:
		return answer{status: http.StatusNotFound, reason: ReasonUnknownFunction, msg: msg}, ResultNotFound
	case codes.InvalidArgument:
		return answer{status: http.StatusBadRequest, reason: ReasonMalformedFunction, msg: msg}, ResultInvalidArgument
	case codes.ResourceExhausted:
		return answer{status: http.StatusServiceUnavailable, reason: ReasonNoCapacity, msg: msg, retryAfter: true, known: true}, ResultResourceExhausted
	case codes.DeadlineExceeded:
		return answer{status: http.StatusServiceUnavailable, reason: ReasonColdStartTimeout,
			msg: "no instance became ready within the cold-start timeout: " + msg, retryAfter: true, known: true}, ResultDeadlineExceeded
	case codes.PermissionDenied:
		if r := callerRefusal(st); r != "" {
			return answer{status: http.StatusForbidden, reason: r, msg: strings.TrimPrefix(msg, r+": "), known: true}, ResultCallerRefused
		}
		return answer{status: http.StatusServiceUnavailable, reason: ReasonControllerError,
			msg: fmt.Sprintf("%s: %s", st.Code(), msg), retryAfter: true}, ResultError
	case codes.Unavailable:
		return answer{status: http.StatusServiceUnavailable, reason: ReasonNoController, msg: msg, retryAfter: true}, ResultUnavailable
	case codes.Canceled:
		// Not the caller (that is context.Canceled above): the connection
		// to the controller closed under the call (ring change, shutdown).
		return answer{status: http.StatusServiceUnavailable, reason: ReasonNoController, msg: msg, retryAfter: true}, ResultUnavailable
	default:
		return answer{status: http.StatusServiceUnavailable, reason: ReasonControllerError,
			msg: fmt.Sprintf("%s: %s", st.Code(), msg), retryAfter: true}, ResultError
	}
}

// ControllerResult is the get_instance_total result of err, a
// GetInstance call's error (nil: ok).
func ControllerResult(err error) string {
	if err == nil {
		return ResultOK
	}
	_, res := controllerAnswer(err)
	return res
}

// unknownAnswer is the 404 of a name the negative cache holds.
func unknownAnswer(ref route.Ref) answer {
	return answer{status: http.StatusNotFound, reason: ReasonUnknownFunction, msg: "function " + ref.String() + " not found"}
}

// badConnectionAnswer is the 400 of a request whose Connection field names
// a field that frames or routes it (h1.ErrBadConnection; issue 30).
func badConnectionAnswer(err error) answer {
	return answer{status: http.StatusBadRequest, reason: ReasonBadConnection,
		msg: "a Connection field may not name Content-Length, Transfer-Encoding, Host or an X-Skipper-* field: " + err.Error()}
}

// tooLargeAnswer is the 413 of a body over the function's limit
// (spec.maxBodyBytes, else --max-body-bytes).
func tooLargeAnswer(limit int64) answer {
	return answer{status: http.StatusRequestEntityTooLarge, reason: ReasonBodyTooLarge,
		msg: "the request body exceeds " + strconv.FormatInt(limit, 10) + " bytes"}
}

// overloadedAnswer is the 503 of a request that found the router at
// --max-in-flight.
func overloadedAnswer(limit int64) answer {
	return answer{status: http.StatusServiceUnavailable, reason: ReasonRouterOverloaded,
		msg: "the router is at its limit of " + strconv.FormatInt(limit, 10) + " requests in flight", retryAfter: true}
}

// queueFullAnswer is the 503 of a request that found every instance at the
// concurrency limit and the function's queue full.
func queueFullAnswer(limit uint32) answer {
	return answer{status: http.StatusServiceUnavailable, reason: ReasonQueueFull,
		msg: "every instance is at the concurrency limit of " + strconv.FormatUint(uint64(limit), 10) + " and the queue is full", retryAfter: true, known: true}
}

// upstreamAnswer maps a proxy error (after any retry) to its answer.
func upstreamAnswer(err error) answer {
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return tooLargeAnswer(tooLarge.Limit)
	case errors.Is(err, errBadBody):
		return answer{status: http.StatusBadRequest, reason: ReasonBadBody, msg: err.Error(), known: true}
	case isDialError(err):
		// Before the context cases: a dial timeout matches
		// context.DeadlineExceeded. The request's own context errors come
		// here bare (ServeHTTP substitutes them).
		return answer{status: http.StatusServiceUnavailable, reason: ReasonNoInstances, msg: err.Error(), retryAfter: true, known: true}
	case errors.Is(err, context.Canceled):
		return answer{status: StatusClientClosed, reason: ReasonClientClosed, msg: "caller went away", known: true}
	case errors.Is(err, context.DeadlineExceeded):
		return answer{status: http.StatusGatewayTimeout, reason: ReasonUpstreamTimeout, msg: "the instance did not answer within the request timeout", known: true}
	default:
		return answer{status: http.StatusBadGateway, reason: ReasonUpstreamError, msg: err.Error(), known: true}
	}
}

// isDialError reports whether err is a failure to connect: the request
// never reached the instance, so sending it elsewhere is safe.
func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

type errorBody struct {
	Error    string `json:"error"`
	Reason   string `json:"reason"`
	Function string `json:"function,omitempty"`
}

// body is a's JSON body.
func (a answer) body(function string) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // messages quote <namespace>/<name>
	_ = enc.Encode(errorBody{Error: a.msg, Reason: a.reason, Function: function})
	return b.Bytes()
}

// write sends a as JSON. A 499 writes nothing: nobody is listening.
func (a answer) write(w http.ResponseWriter, function string) {
	if a.status == StatusClientClosed {
		return
	}
	b := a.body(function)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	if a.retryAfter {
		h.Set("Retry-After", retryAfter)
	}
	w.WriteHeader(a.status)
	_, _ = w.Write(b)
}
