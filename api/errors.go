package api

import (
	"errors"
	"fmt"
	"net/http"
)

// The error kinds. Every error that crosses the API wraps exactly one of them,
// so errors.Is(err, api.ErrNotFound) holds on the server and in the client.
var (
	ErrNotFound     = errors.New("not found")
	ErrConflict     = errors.New("conflict")
	ErrInvalid      = errors.New("invalid")
	ErrForbidden    = errors.New("forbidden")
	ErrUnavailable  = errors.New("unavailable")
	ErrTooLarge     = errors.New("too large")
	ErrUnauthorized = errors.New("unauthorized")
	ErrInternal     = errors.New("internal")
)

// kinds maps each error kind to its wire code and HTTP status; it is the one
// table both directions use.
var kinds = []struct {
	err    error
	code   string
	status int
}{
	{ErrNotFound, "not_found", http.StatusNotFound},
	{ErrConflict, "conflict", http.StatusConflict},
	{ErrInvalid, "invalid", http.StatusBadRequest},
	{ErrForbidden, "forbidden", http.StatusForbidden},
	{ErrUnavailable, "unavailable", http.StatusServiceUnavailable},
	{ErrTooLarge, "too_large", http.StatusRequestEntityTooLarge},
	{ErrUnauthorized, "unauthorized", http.StatusUnauthorized},
	{ErrInternal, "internal", http.StatusInternalServerError},
}

// ErrorBody is sbx's one error envelope: the JSON body of every error
// response, and what every stream's "error" event holds. The frames of the
// exec, fork and progress streams embed it, so their "error" event is the
// same envelope with its event name beside it:
// {"event":"error","error":{"code":"conflict","message":"..."}}.
// Error is nil in a frame that is no error.
type ErrorBody struct {
	Error *ErrorDetail `json:"error,omitempty"`
}

// Envelope is err as an ErrorBody: its message, and its kind's code.
func Envelope(err error) ErrorBody {
	_, code := StatusOf(err)
	return ErrorBody{Error: &ErrorDetail{Code: code, Message: err.Error()}}
}

// Err is the error the envelope carries, of the kind its code names (nil
// when it carries none).
func (b ErrorBody) Err() error {
	if b.Error == nil {
		return nil
	}
	return StreamError(b.Error.Code, b.Error.Message)
}

// ErrorDetail names the kind of an error and says what happened.
type ErrorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// StatusOf returns the HTTP status and wire code for err.
func StatusOf(err error) (int, string) {
	for _, k := range kinds {
		if errors.Is(err, k.err) {
			return k.status, k.code
		}
	}
	return http.StatusInternalServerError, "internal"
}

// Error is an error decoded from the wire: its message is the server's and
// it matches the kind named by its code under errors.Is.
type Error struct {
	Status  int
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Message }

// Is reports whether target is the kind this error's code names.
func (e *Error) Is(target error) bool {
	for _, k := range kinds {
		if k.code == e.Code {
			return k.err == target
		}
	}
	return false
}

// Errorf returns an error of the given kind: errors.Is(Errorf(ErrInvalid, ...), ErrInvalid).
func Errorf(kind error, format string, args ...any) error {
	return &kindError{kind: kind, msg: fmt.Sprintf(format, args...)}
}

type kindError struct {
	kind error
	msg  string
}

func (e *kindError) Error() string { return e.msg }
func (e *kindError) Unwrap() error { return e.kind }

// StreamError is the error an envelope carries (an error response's, or a
// stream's "error" event's): of the kind its code names (so errors.Is
// works), or of no kind without one.
func StreamError(code, message string) error {
	if message == "" {
		message = "the server reported an error without a message"
	}
	for _, k := range kinds {
		if k.code == code {
			return &Error{Status: k.status, Code: code, Message: message}
		}
	}
	return errors.New(message)
}
