package pqcache

// The C side of the hooks (hooks.go): trampolines from the library's
// function pointers to the exported Go functions. They live in a file of
// their own because cgo allows only declarations, not definitions, in the
// preamble of a file with //export.

/*
#include <stdint.h>
#include "pqcache.h"

extern void goPqLogHook(uintptr_t handle, int32_t level, char* message);
extern void goPqBuildDoneHook(uintptr_t handle, uint64_t seq_id, int32_t layer, int32_t status);
extern void goPqBuildProgressHook(uintptr_t handle, pq_build_progress* progress);

static void go_pq_log(void* user, int32_t level, const char* message) {
  goPqLogHook((uintptr_t)user, level, (char*)message);
}

static void go_pq_build_done(void* user, uint64_t seq_id, int32_t layer, pq_status status) {
  goPqBuildDoneHook((uintptr_t)user, seq_id, layer, (int32_t)status);
}

static void go_pq_build_progress(void* user, const pq_build_progress* progress) {
  goPqBuildProgressHook((uintptr_t)user, (pq_build_progress*)progress);
}

// pq_create_with_hooks with the trampolines that are asked for; handle (a
// cgo.Handle, an integer, not a Go pointer) is their user pointer.
static pq_status go_pq_create_with_hooks(const pq_config* config, uintptr_t handle, int log,
                                         int32_t log_level, int build_done, int build_progress,
                                         pq_pool* pool, pq_context** out) {
  pq_hooks hooks;
  pq_hooks_default(&hooks);
  hooks.log_level = log_level;
  if (log) {
    hooks.log = go_pq_log;
    hooks.log_user = (void*)handle;
  }
  if (build_done) {
    hooks.build_done = go_pq_build_done;
    hooks.build_done_user = (void*)handle;
  }
  if (build_progress) {
    hooks.build_progress = go_pq_build_progress;
    hooks.build_progress_user = (void*)handle;
  }
  hooks.pool = pool;
  return pq_create_with_hooks(config, &hooks, out);
}
*/
import "C"

import (
	"runtime/cgo"
	"unsafe"

	"libpqcache.org/pqcache/internal/pqswig"
)

// createWithHooks runs pq_create_with_hooks for NewContextWithHooks; the
// handle carries h to the trampolines.
func createWithHooks(cc pqswig.Pq_config, h *Hooks, handle cgo.Handle) (pqswig.Struct_SS_pq_context, error) {
	var created *C.pq_context
	var pool *C.pq_pool
	if h.Pool != nil {
		pool = h.Pool.pool
	}
	flag := func(on bool) C.int {
		if on {
			return 1
		}
		return 0
	}
	err := call("pq_create_with_hooks", func() Status {
		return Status(C.go_pq_create_with_hooks(cConfig(cc), C.uintptr_t(handle), flag(h.Log != nil),
			C.int32_t(h.LogLevel), flag(h.BuildDone != nil), flag(h.BuildProgress != nil), pool,
			&created))
	})
	if err != nil {
		return nil, err
	}
	return pqswig.SwigcptrStruct_SS_pq_context(uintptr(unsafe.Pointer(created))), nil
}

// newPool and the pool's calls, in cgo: a pq_pool never reaches Go memory.
func newPool(threads int) (*C.pq_pool, error) {
	var p *C.pq_pool
	err := call("pq_pool_create", func() Status { return Status(C.pq_pool_create(C.int32_t(threads), &p)) })
	return p, err
}

func poolThreads(p *C.pq_pool) (int, error) {
	var n C.int32_t
	err := call("pq_pool_threads", func() Status { return Status(C.pq_pool_threads(p, &n)) })
	return int(n), err
}

func destroyPool(p *C.pq_pool) { C.pq_pool_destroy(p) }
