package instance

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
)

// errorBody is the JSON body of every refusal: a controller branches on
// its reason.
type errorBody struct {
	Error  string `json:"error"`
	Reason string `json:"reason"`
}

// WriteError answers status with the JSON error body {"error": msg,
// "reason": reason}, the shape of the contract's refusals; a runtime
// answers its own refusals with it too.
func WriteError(w http.ResponseWriter, status int, reason, msg string) {
	WriteJSON(w, status, errorBody{Error: msg, Reason: reason})
}

// WriteJSON answers status with v as JSON, HTML not escaped (answers
// quote "<namespace>/<name>"), with its Content-Length; 500 when v does
// not encode.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(b.Len()))
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}
