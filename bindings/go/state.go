package pqcache

/*
#include <stdlib.h>
#include "pqcache.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"strings"
	"unsafe"

	"libpqcache.org/pqcache/internal/pqswig"
)

// Sequence state (added in 0.5): truncate, fork, save and restore. The
// calls that take bytes or a path are made here in cgo (bindings/swig/go.i
// ignores them): a Go []byte reaches the library as a call argument,
// without a copy, and the library keeps no pointer to it after the call.

// saveAttempts is how many times SaveSequence sizes its buffer again when
// the sequence grew between pq_sequence_state_size and the save (only a
// call racing with the save, which pqcache.h forbids, makes it grow).
const saveAttempts = 3

// TruncateSequence keeps the first tokens tokens of every layer of seq and
// drops the rest (pq_sequence_truncate), as when rejected speculative
// tokens are rolled back: the next decode step is as if the dropped tokens
// never came. A layer with tokens or fewer tokens is left as it is; a cut
// inside a layer's prefill rebuilds its index over the kept tokens; 0
// empties the sequence (the next call on a layer is then PrefillLayer).
// Errors: ErrNotFound, ErrInvalidArgument (tokens negative or more than the
// longest layer holds), ErrOutOfMemory. No other call on seq may run
// concurrently.
func (c *Context) TruncateSequence(seq uint64, tokens int64) error {
	return c.do("pq_sequence_truncate", func(h pqswig.Struct_SS_pq_context) Status {
		return Status(pqswig.Pq_sequence_truncate(h, seq, tokens))
	})
}

// ForkSequence adds child holding the same tokens, PQ index and selector
// state as parent (pq_sequence_fork), for requests that share a prompt or
// parallel samples. Full 256-token chunks are shared copy-on-write (counted
// once against the host memory limit); from then on each sequence grows on
// its own. Errors: ErrNotFound (parent), ErrInvalidArgument (child exists),
// ErrOutOfMemory, ErrBadState (a build of the parent failed).
func (c *Context) ForkSequence(parent, child uint64) error {
	return c.do("pq_sequence_fork", func(h pqswig.Struct_SS_pq_context) Status {
		return Status(pqswig.Pq_sequence_fork(h, parent, child))
	})
}

// SequenceStateSize is the number of bytes SaveSequence would return now
// (pq_sequence_state_size); it waits for the sequence's index builds.
func (c *Context) SequenceStateSize(seq uint64) (int64, error) {
	var size int
	err := c.withHandle("pq_sequence_state_size", func(h pqswig.Struct_SS_pq_context) (err error) {
		size, err = stateSize(h, seq)
		return err
	})
	return int64(size), err
}

func stateSize(h pqswig.Struct_SS_pq_context, seq uint64) (int, error) {
	const op = "pq_sequence_state_size"
	var bytes C.uint64_t
	if err := call(op, func() Status {
		return Status(C.pq_sequence_state_size(cContext(h), C.uint64_t(seq), &bytes))
	}); err != nil {
		return 0, err
	}
	return stateLen(op, bytes)
}

// stateLen is a size the library reported, as a slice length.
func stateLen(op string, bytes C.uint64_t) (int, error) {
	if uint64(bytes) > uint64(^uint(0)>>1) {
		return 0, &Error{Op: op, Status: ErrOutOfMemory,
			Message: fmt.Sprintf("%s: a saved state of %d bytes does not fit in a Go slice", op, uint64(bytes))}
	}
	return int(bytes), nil
}

// bytesPointer is &b[0], or a pointer to a zero byte for an empty slice: the
// library then sees an empty, non-NULL buffer.
func bytesPointer(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return unsafe.Pointer(new(byte))
	}
	return unsafe.Pointer(&b[0])
}

// SaveSequence returns seq's state (every layer's K/V, PQ index, window
// position and selector state) in the versioned, checksummed format of
// docs/state-format.md, for RestoreSequence in this or another context of
// the same geometry. It is sized with pq_sequence_state_size, then written
// by pq_sequence_save_buffer, and sized again if the library asks for more.
// It waits for the sequence's index builds. No call that changes seq may
// run concurrently.
func (c *Context) SaveSequence(seq uint64) ([]byte, error) {
	const op = "pq_sequence_save_buffer"
	var state []byte
	err := c.withHandle(op, func(h pqswig.Struct_SS_pq_context) error {
		size, err := stateSize(h, seq)
		for attempt := 1; err == nil; attempt++ {
			state = make([]byte, size)
			var written C.uint64_t
			err = call(op, func() Status {
				return Status(C.pq_sequence_save_buffer(cContext(h), C.uint64_t(seq),
					bytesPointer(state), C.uint64_t(len(state)), &written))
			})
			if err == nil {
				if uint64(written) > uint64(len(state)) {
					return &Error{Op: op, Status: ErrInternal,
						Message: fmt.Sprintf("%s: reported %d bytes written into %d", op, uint64(written), len(state))}
				}
				state = state[:written]
				return nil
			}
			if !errors.Is(err, ErrBufferTooSmall) || attempt == saveAttempts {
				return err
			}
			size, err = stateLen(op, written) // the size needed now
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return state, nil
}

// doPath runs one library call that takes a path, passed as a C string for
// the call's duration. A NUL byte in path is refused (C would see a shorter
// path).
func (c *Context) doPath(op, path string, f func(h pqswig.Struct_SS_pq_context, p *C.char) Status) error {
	if strings.IndexByte(path, 0) >= 0 {
		return invalid(op, "path is %q; expected a path without NUL bytes", path)
	}
	p := C.CString(path)
	defer C.free(unsafe.Pointer(p))
	return c.do(op, func(h pqswig.Struct_SS_pq_context) Status { return f(h, p) })
}

// SaveSequenceFile saves seq's state into the file at path, atomically
// (pq_sequence_save_file: a temporary file beside it, fsync, rename; on
// failure path is left as it was). A file system error is ErrBackend, with
// the path and the OS's text.
func (c *Context) SaveSequenceFile(seq uint64, path string) error {
	return c.doPath("pq_sequence_save_file", path, func(h pqswig.Struct_SS_pq_context, p *C.char) Status {
		return Status(C.pq_sequence_save_file(cContext(h), C.uint64_t(seq), p))
	})
}

// RestoreSequence adds seq from a state SaveSequence returned, in this or
// another context of the same geometry (pq_sequence_restore). Every section
// is checked first: the whole sequence is added or nothing. Its selections
// and fetched rows equal the saved sequence's. Errors: ErrInvalidArgument
// (seq exists), ErrCorrupt (truncated or damaged bytes), ErrIncompatible
// (another format version or geometry), ErrOutOfMemory.
func (c *Context) RestoreSequence(seq uint64, state []byte) error {
	// An empty slice passes a non-NULL pointer too: the library reports an
	// empty state as corrupt, not as a NULL argument.
	return c.do("pq_sequence_restore", func(h pqswig.Struct_SS_pq_context) Status {
		return Status(C.pq_sequence_restore(cContext(h), C.uint64_t(seq), bytesPointer(state),
			C.uint64_t(len(state))))
	})
}

// RestoreSequenceFile is RestoreSequence from the file at path
// (pq_sequence_restore_file); a missing file is ErrNotFound, a read error
// ErrBackend.
func (c *Context) RestoreSequenceFile(seq uint64, path string) error {
	return c.doPath("pq_sequence_restore_file", path, func(h pqswig.Struct_SS_pq_context, p *C.char) Status {
		return Status(C.pq_sequence_restore_file(cContext(h), C.uint64_t(seq), p))
	})
}

// RestoreSequenceBegin begins a restore in pieces, for a state that arrives
// in parts (a shared tier, a network): it reads the state's description
// from the start of state (header, every layer's PQ index and selector
// state, about 1% of the bytes, saved before any K/V; state may hold more)
// and adds seq (pq_sequence_restore_begin). The whole sequence's memory is
// reserved now. Its PQ selections work at once and equal the saved
// sequence's; every call that needs K/V (FetchKV, DecodeAttend,
// DecodeAppend, PrefillLayer, TruncateSequence, ForkSequence, SaveSequence)
// and a select with another selector is ErrBadState until
// RestoreSequenceKV has brought that layer's. consumed is the bytes read:
// the first RestoreSequenceKV starts there. If state ends before the
// description does, nothing is added and the error is an *Error with
// ErrBufferTooSmall whose Needed is the bytes needed from the state's
// start. Other errors: as RestoreSequence.
func (c *Context) RestoreSequenceBegin(seq uint64, state []byte) (consumed uint64, err error) {
	return c.restoreStep("pq_sequence_restore_begin", state,
		func(h pqswig.Struct_SS_pq_context, data unsafe.Pointer, size C.uint64_t, out *C.uint64_t) Status {
			return Status(C.pq_sequence_restore_begin(cContext(h), C.uint64_t(seq), data, size, out))
		})
}

// RestoreSequenceKV reads exactly one next section of a restore begun with
// RestoreSequenceBegin (pq_sequence_restore_kv): data starts at the first
// byte not yet read (the sum of the consumed so far) and may hold more;
// consumed is the section's size. The sections are each layer's K/V in
// layer order, then the end section; after the end section the sequence is
// complete and further calls are ErrBadState. A data shorter than the
// section is an *Error with ErrBufferTooSmall whose Needed is the section's
// size. A section that fails its checksum or comes out of order is
// ErrCorrupt and changes nothing (the right bytes may be given again); K/V
// that do not fit the layer, or hold a NaN or Inf, are ErrCorrupt and end
// the restore (the sequence must be removed). Calls for one seq must not
// overlap; selections on seq may run meanwhile.
func (c *Context) RestoreSequenceKV(seq uint64, data []byte) (consumed uint64, err error) {
	return c.restoreStep("pq_sequence_restore_kv", data,
		func(h pqswig.Struct_SS_pq_context, p unsafe.Pointer, size C.uint64_t, out *C.uint64_t) Status {
			return Status(C.pq_sequence_restore_kv(cContext(h), C.uint64_t(seq), p, size, out))
		})
}

// restoreStep makes one pq_sequence_restore_begin or _kv call (op) over
// data; on ErrBufferTooSmall the error's Needed is what the call wrote.
func (c *Context) restoreStep(op string, data []byte,
	f func(h pqswig.Struct_SS_pq_context, p unsafe.Pointer, size C.uint64_t, out *C.uint64_t) Status) (uint64, error) {
	var consumed C.uint64_t
	// An empty slice passes a non-NULL pointer too: a short state, not a
	// NULL argument.
	err := c.do(op, func(h pqswig.Struct_SS_pq_context) Status {
		return f(h, bytesPointer(data), C.uint64_t(len(data)), &consumed)
	})
	if err != nil {
		var e *Error
		if errors.As(err, &e) && e.Status == ErrBufferTooSmall {
			e.Needed = uint64(consumed)
		}
		return 0, err
	}
	if uint64(consumed) > uint64(len(data)) {
		return 0, &Error{Op: op, Status: ErrInternal,
			Message: fmt.Sprintf("%s: reported %d bytes read of %d", op, uint64(consumed), len(data))}
	}
	return uint64(consumed), nil
}
