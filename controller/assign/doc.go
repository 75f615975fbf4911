// Package assign is the instance contract shared by the controller (which
// signs) and instance runtimes such as skipper-echo (which verify): the body
// of `POST /__skipper/assign` and its ed25519-signed token.
//
// A token is "v1.<payload>.<signature>", both parts unpadded base64url; the
// payload is JSON Claims and the signature covers the bytes "v1." + payload.
// Verify checks the signature, that the audience is the verifier's own pod
// UID and that the token has not expired. The package does no I/O beyond
// parsing PEM it is handed.
package assign
