package pqcache

import (
	"fmt"
	"runtime"

	"libpqcache.org/pqcache/internal/pqswig"
)

// Status is a pq_status code. Its non-OK values are the sentinels that
// errors.Is matches: errors.Is(err, pqcache.ErrNotFound).
type Status int32

// The values of pq_status (include/pqcache.h); a test checks them against
// the generated layer.
const (
	OK                 Status = 0
	ErrInvalidArgument Status = -1
	ErrOutOfMemory     Status = -2
	ErrBadState        Status = -3
	ErrNotFound        Status = -4
	ErrUnsupported     Status = -5
	ErrBackend         Status = -6
	ErrInternal        Status = -7
	// ErrBufferTooSmall (added in 0.4; InvalidArgument before): an output
	// buffer is too small and the library wrote the size it needs. The
	// methods of this package size their own buffers and grow them on it.
	ErrBufferTooSmall Status = -8
	// ErrCorrupt (added in 0.5): saved sequence state that is not intact
	// (truncated, a checksum or magic number that does not match, an
	// inconsistent field). Nothing was restored.
	ErrCorrupt Status = -9
	// ErrIncompatible (added in 0.5): saved sequence state that is intact
	// but cannot be restored here (another format version, or a geometry
	// other than the context's). Nothing was restored.
	ErrIncompatible Status = -10
)

// Error returns the library's name of the status, e.g.
// "PQ_ERR_NOT_FOUND: ...".
func (s Status) Error() string { return pqswig.Pq_status_string(int(s)) }

// Error is a failed call: the function, the status and the message
// pq_last_error gave for it, e.g. "pq_create: config.num_q_heads is 3, not a
// multiple of num_kv_heads 2 (...)": it names the function, the argument,
// the value and what was expected.
type Error struct {
	Op      string // the C function, e.g. "pq_create"
	Status  Status
	Message string
	// Needed is, for ErrBufferTooSmall from RestoreSequenceBegin or
	// RestoreSequenceKV, the bytes the call needs from the start of the
	// slice it was given; 0 otherwise.
	Needed uint64
}

func (e *Error) Error() string { return "pqcache: " + e.Message }

// Unwrap lets errors.Is(err, ErrNotFound) match on the status.
func (e *Error) Unwrap() error { return e.Status }

// call runs one library call and turns a failure into *Error. The message
// is thread-local in the library and a goroutine may move between OS
// threads between two cgo calls, so the goroutine stays on its thread from
// the call until the message has been read.
func call(op string, f func() Status) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if s := f(); s != OK {
		return &Error{Op: op, Status: s, Message: pqswig.Pq_last_error()}
	}
	return nil
}

// invalid reports bad input found on the Go side, before the library is
// called (a slice shorter than its shape, a layer out of int32 range), the
// same way as the library reports its own.
func invalid(op, format string, args ...any) error {
	return &Error{Op: op, Status: ErrInvalidArgument, Message: op + ": " + fmt.Sprintf(format, args...)}
}
