/* go.i - the Go-specific part of pqcache.i (included under SWIGGO).
 *
 * The generated package (pqswig, internal to the Go module in bindings/go)
 * gives the structs, the enum constants and the simple calls. The idiomatic
 * package on top of it (bindings/go/*.go) is the public API. */

/* The wrapper's header and library flags come from pkg-config (pqcache.pc),
 * as in the idiomatic package (bindings/go/tensor.go). */
%insert(cgo_comment_typedefs) %{
#cgo pkg-config: pqcache
%}

/* Integer out-parameters become one-element Go slices: Pq_sequence_length(ctx,
 * seq, layer, out) with out := make([]int64, 1). */
%include <typemaps.i>
%apply long long *OUTPUT { int64_t* out_tokens, int64_t* out_count, int64_t* out_capacity,
                           int64_t* out_rows };
%apply int *OUTPUT { int32_t* out_backend };

/* pq_create's pq_context** out: New_contextOut() allocates the slot,
 * ContextOut_value() reads the handle, Delete_contextOut() frees the slot. */
%include <cpointer.i>
%pointer_functions(pq_context*, contextOut);

/* A setter for a const char* member would store a pointer to memory that
 * SWIG's Go string conversion frees after the call; the Go layer sets these
 * fields itself with C.CString, for the duration of pq_create. */
%immutable pq_config::cuda_plugin_path;
%immutable pq_config::kv_disk_path;
/* The fp8 scales likewise: NewContext points them at C memory it frees. */
%immutable pq_config::kv_scales;

/* Calls that take the caller's buffers are written in cgo in the idiomatic
 * layer (bindings/go/tensor.go): SWIG would pass the data pointers as
 * uintptr, which cgo's pointer rules forbid for Go memory, so the Go slices
 * could not be passed without copying. Ignored here so that nobody uses the
 * unsafe versions by mistake. */
%ignore pq_tensor_init;
%ignore pq_prefill_layer;
%ignore pq_decode_append;
%ignore pq_decode_select;
%ignore pq_fetch_kv;
%ignore pq_decode_attend;
%ignore pq_decode_tail;
%ignore pq_prefill_queries;
%ignore pq_observe_attention;
%ignore pq_sequence_token_classes;
%ignore pq_decode_speculate;
%ignore pq_index_codes;
%ignore pq_index_centroids;
%ignore pq_sequence_set_stream;
/* The decode step kept on the device (0.7) takes device arrays and a CUDA
 * stream, which a Go program does not hold (as pq_sequence_set_stream);
 * a Go server with CUDA memory calls the C API through cgo. */
%ignore pq_decode_select_device;
%ignore pq_fetch_kv_device;
%ignore pq_decode_select_device_batch;
%ignore pq_fetch_kv_device_batch;
/* The batch calls' items point at the data as well; bindings/go/batch.go
 * builds them in C memory. */
%ignore pq_select_item;
%ignore pq_fetch_item;
%ignore pq_decode_select_batch;
%ignore pq_fetch_kv_batch;
/* The paged keys (0.10) point at the caller's pool and maps, and the
 * multi-token select writes the caller's rows: bindings/go/paged.go builds
 * the descriptors on the C stack, as tensor.go does. */
%ignore pq_paged_keys;
%ignore pq_prefill_layer_paged;
%ignore pq_decode_append_paged;
%ignore pq_decode_select_multi;
%ignore pq_decode_select_multi_device;
/* Sequence state (0.5): the calls that take the caller's bytes or a path
 * are written in cgo (bindings/go/state.go), for the reason above (and a
 * path's NUL check), with pq_sequence_state_size that sizes the bytes.
 * pq_sequence_save's pq_write_fn callback is not offered in Go. */
%ignore pq_sequence_save;
%ignore pq_sequence_state_size;
%ignore pq_sequence_save_buffer;
%ignore pq_sequence_save_file;
%ignore pq_sequence_restore;
%ignore pq_sequence_restore_file;
%ignore pq_sequence_restore_begin;
%ignore pq_sequence_restore_kv;
