// Package assign is the instance contract shared by the controller (which
// signs), instance runtimes such as skipper-echo (which verify) and the
// router (whose pre-connections send its read-only GET and read the answer):
// the body of `POST /__skipper/assign` and its ed25519-signed token. It
// imports only the standard library and go-jose, so the router may import
// it.
//
// A token comes in one of two formats (format.go): FormatJWS, a JWT any
// JOSE library verifies (compact JWS, alg EdDSA, payload the JSON Claims,
// signed and verified with go-jose), or FormatV1, Skipper's own
// "v1.<payload>.<signature>", both parts unpadded base64url, the
// signature over the bytes "v1." + payload. An instance lists those it
// verifies in HeaderTokenFormats on its GET answers; controllers sign in
// the first listed they can (PickFormat), FormatV1 for an instance that
// lists none. Verify takes either and checks the signature against any of
// the keys it is given (two while a key rotates), that the audience is the
// verifier's own pod UID and that the token has not expired.
//
// A token binds the whole request: SignRequest puts a random id and
// RequestDigest of the body's other fields in the claims, and
// VerifyRequest refuses a body that does not match them, so a captured
// token cannot carry another config, callers, oneshot flag or timeout.
// Used remembers the ids an instance accepted until they expire, so a
// token assigns once. The claims only grow, like the proto: instances
// older than the id and the digest ignore them and still verify the
// token, so controllers roll out first; an instance refuses a token
// without them (ErrUnbound).
//
// The package does no I/O beyond parsing PEM it is handed, and reads the
// clock only through the now it is passed.
package assign
