/* java.i - the Java part of pqcache.i (included under SWIGJAVA).
 *
 * The generated classes (package io.pqcache.swig) are the binding's private
 * layer; bindings/java/src/main/java/io/pqcache wraps them in the idiomatic
 * API. What this file changes from SWIG's defaults, and why:
 *
 *  - pq_status results throw io.pqcache.PqException(status, pq_last_error())
 *    from native code, so the thread-local message is read in the same
 *    native call that failed: nothing can run on the thread in between.
 *  - pq_context* travels as a Java long (the idiomatic PqContext owns it and
 *    guards its lifetime); pq_create's pq_context** out is a long[1].
 *  - Tensor data and selection arrays are direct NIO buffers, passed by
 *    address (GetDirectBufferAddress): no copy. Heap buffers are rejected
 *    with IllegalArgumentException; their sizes are checked in Java, where
 *    the tensor geometry is known.
 *  - uint64_t is a Java long (bit pattern kept; ids and counters are
 *    unsigned in C), not java.math.BigInteger.
 *  - Enums are plain int constants: the idiomatic layer has its own enums.
 */

%include <enumtypeunsafe.swg>
%javaconst(1);

/* Load the JNI library (java.library.path first, else the copy bundled in
 * the jar) before any native method runs. */
%pragma(java) jniclasscode=%{
  static {
    NativeLoader.load();
  }
%}

/* ---- scalar outputs as one-element arrays --------------------------------- */
%include <typemaps.i>
%apply long long* OUTPUT { int64_t* out_capacity, int64_t* out_tokens, int64_t* out_count,
                           int64_t* out_rows };
%apply int* OUTPUT { int32_t* out_backend };

/* ---- uint64_t as long ---------------------------------------------------- */
%apply long long { uint64_t };
%apply const long long & { const uint64_t & };

/* ---- pq_status: throw on error ------------------------------------------ */
%{
/* Throws io.pqcache.PqException(int status, String message); JNI ignores
 * Java access rules, so the constructor can stay package-private. */
static void pqj_throw_status(JNIEnv* jenv, int status) {
  jclass cls = (*jenv)->FindClass(jenv, "io/pqcache/PqException");
  jmethodID ctor;
  jstring message;
  jobject exception;
  if (cls == NULL) return; /* NoClassDefFoundError is pending */
  ctor = (*jenv)->GetMethodID(jenv, cls, "<init>", "(ILjava/lang/String;)V");
  if (ctor == NULL) return;
  message = (*jenv)->NewStringUTF(jenv, pq_last_error());
  if (message == NULL) return; /* OutOfMemoryError is pending */
  exception = (*jenv)->NewObject(jenv, cls, ctor, (jint)status, message);
  if (exception != NULL) (*jenv)->Throw(jenv, (jthrowable)exception);
}
%}
%typemap(out) pq_status %{
  if ($1 != PQ_OK) {
    pqj_throw_status(jenv, (int)$1);
    return $null;
  }
  $result = (jint)$1;
%}

/* ---- handles as longs ----------------------------------------------------- */
/* pq_context*, pq_pool* and the hooks' pqj_hooks* (java_hooks.i) travel as
 * Java longs: the idiomatic classes (PqContext, PqPool) own them and guard
 * their lifetime. pq_create's and pq_pool_create's TYPE** out is a long[1]. */
%define PQJ_LONG_HANDLE(TYPE)
%typemap(jni) TYPE*, const TYPE* "jlong"
%typemap(jtype) TYPE*, const TYPE* "long"
%typemap(jstype) TYPE*, const TYPE* "long"
%typemap(javain) TYPE*, const TYPE* "$javainput"
%typemap(javaout) TYPE*, const TYPE* { return $jnicall; }
%typemap(in) TYPE*, const TYPE* %{ $1 = ($1_ltype)(intptr_t)$input; %}
%typemap(out) TYPE*, const TYPE* %{ $result = (jlong)(intptr_t)$1; %}

%typemap(jni) TYPE** out "jlongArray"
%typemap(jtype) TYPE** out "long[]"
%typemap(jstype) TYPE** out "long[]"
%typemap(javain) TYPE** out "$javainput"
%typemap(in) TYPE** out (TYPE* handle = NULL) %{
  if ($input == NULL || (*jenv)->GetArrayLength(jenv, $input) < 1) {
    SWIG_JavaThrowException(jenv, SWIG_JavaIllegalArgumentException, "out must be a long[1]");
    return $null;
  }
  $1 = &handle;
%}
%typemap(argout) TYPE** out %{
  {
    jlong value = (jlong)(intptr_t)handle$argnum;
    (*jenv)->SetLongArrayRegion(jenv, $input, 0, 1, &value);
  }
%}
%enddef
PQJ_LONG_HANDLE(pq_context)
PQJ_LONG_HANDLE(pq_pool)
PQJ_LONG_HANDLE(pqj_hooks)

/* log, build_done and pool of pq_create_with_hooks, calling Java. */
%include "java_hooks.i"

/* ---- direct NIO buffers by address --------------------------------------- */
%typemap(jni) void* DIRECT_BUFFER "jobject"
%typemap(jtype) void* DIRECT_BUFFER "java.nio.Buffer"
%typemap(jstype) void* DIRECT_BUFFER "java.nio.Buffer"
%typemap(javain) void* DIRECT_BUFFER "$javainput"
%typemap(in) void* DIRECT_BUFFER %{
  $1 = NULL;
  if ($input != NULL) {
    $1 = (*jenv)->GetDirectBufferAddress(jenv, $input);
    if ($1 == NULL) {
      SWIG_JavaThrowException(jenv, SWIG_JavaIllegalArgumentException,
                              "$1_name must be a direct buffer (ByteBuffer.allocateDirect), not a heap buffer");
      return $null;
    }
  }
%}
%apply void* DIRECT_BUFFER { void* data };

/* pq_tensor.data is set through pq_tensor_init only: a getter would hand
 * out a raw address the JVM cannot track. */
%ignore pq_tensor::data;

/* A selection's arrays are the caller's buffers; attach them by address. */
%ignore pq_selection::positions;
%ignore pq_selection::counts;
%apply void* DIRECT_BUFFER { void* positions, void* counts };
%extend pq_selection {
  void attach(void* positions, void* counts, int64_t capacity) {
    $self->positions = (int32_t*)positions;
    $self->counts = (int32_t*)counts;
    $self->capacity = capacity;
  }
}

/* Paged keys (0.10): the pool is a pq_tensor made with pq_tensor_init and
 * copied in; the slot map and block table are direct buffers attached by
 * address, as a selection's arrays (a NULL buffer is no map). */
%ignore pq_paged_keys::slots;
%ignore pq_paged_keys::block_table;
%apply void* DIRECT_BUFFER { void* slots, void* block_table };
%extend pq_paged_keys {
  void attach(const pq_tensor* pool, void* slots, void* block_table, int32_t block_size,
              int64_t map_length, int64_t tokens) {
    if (pool != NULL) $self->pool = *pool;
    $self->slots = (const int64_t*)slots;
    $self->block_table = (const int32_t*)block_table;
    $self->block_size = block_size;
    $self->map_length = map_length;
    $self->tokens = tokens;
  }
}

/* Sequence state (0.5): pq_sequence_save_buffer's buffer and
 * pq_sequence_restore's data are direct buffers, the sizes long[1]
 * outputs. pq_sequence_save's pq_write_fn callback has no Java counterpart
 * here (the idiomatic layer saves to a byte[] or a file). */
%apply void* DIRECT_BUFFER { void* buffer, const void* data };
%apply long long* OUTPUT { uint64_t* out_bytes, uint64_t* out_written };
%ignore pq_sequence_save;
/* pq_sequence_restore_begin / _kv write *out_consumed on PQ_ERR_BUFFER_TOO_SMALL
 * too (the bytes needed), but a failing status throws before a long[1]
 * output is copied back: so out_consumed is an 8-byte direct buffer (native
 * order) that the library writes in place, read after the exception. */
%apply void* DIRECT_BUFFER { uint64_t* out_consumed };

/* pq_observe_attention's probabilities: a direct buffer as well. */
%apply void* DIRECT_BUFFER { const float* probs };
/* pq_sequence_token_classes' classes: a direct buffer of count bytes. */
%apply void* DIRECT_BUFFER { const uint8_t* classes };
/* pq_index_codes / pq_index_centroids outputs, and pq_decode_attend's out
 * and out_lse (a null out_lse is NULL: no log-sum-exp). */
%apply void* DIRECT_BUFFER { uint8_t* out, float* out, float* out_lse };

/* The plug-in path is a borrowed const char* the generated setter would
 * leak; the Java binding leaves it to $PQCACHE_CUDA_PLUGIN and the default
 * search order. */
%ignore pq_config::cuda_plugin_path;
/* The disk tier's directory cannot be left out like it (the disk tier needs
 * it): the struct owns a copy, freed with the struct or when set again, as
 * in python.i; the library reads it during pq_create only. */
%typemap(memberin) const char* kv_disk_path {
  free((char*)$1);
  $1 = NULL;
  if ($input != NULL) {
    size_t size = strlen($input) + 1;
    char* copy = (char*)malloc(size);
    if (copy != NULL) $1 = (const char*)memcpy(copy, $input, size);
  }
}
/* The fp8 scales (0.10) likewise: the struct owns a copy (set_kv_scales,
 * from a direct buffer), freed with it; a struct pq_get_config filled
 * points at the context's copy, which forget_kv_scales lets go of. */
%ignore pq_config::kv_scales;
%apply void* DIRECT_BUFFER { const float* kv_scale_values };
/* pq_sequence_set_stream's cudaStream_t has no Java counterpart, nor do
 * the device arrays of the decode step kept on the device (0.7). */
%ignore pq_sequence_set_stream;
%ignore pq_decode_select_device;
%ignore pq_fetch_kv_device;
%ignore pq_decode_select_device_batch;
%ignore pq_decode_select_multi_device;
%ignore pq_fetch_kv_device_batch;

/* Structs the library reads a struct_size from come out of Java's `new`
 * ready to use (zeroed, struct_size = sizeof as this binding was built). */
%extend pq_stats {
  pq_stats() {
    pq_stats* stats = (pq_stats*)calloc(1, sizeof *stats);
    if (stats != NULL) stats->struct_size = (uint32_t)sizeof *stats;
    return stats;
  }
}
%extend pq_layer_info {
  pq_layer_info() {
    pq_layer_info* info = (pq_layer_info*)calloc(1, sizeof *info);
    if (info != NULL) info->struct_size = (uint32_t)sizeof *info;
    return info;
  }
}
%extend pq_config {
  pq_config() {
    pq_config* config = (pq_config*)calloc(1, sizeof *config);
    if (config != NULL) pq_config_default(config);
    return config;
  }
  ~pq_config() {
    free((char*)$self->kv_disk_path);
    free((float*)$self->kv_scales);
    free($self);
  }
  void set_kv_scales(const float* kv_scale_values, int32_t count) {
    float* copy = NULL;
    if (kv_scale_values != NULL && count > 0) {
      copy = (float*)malloc((size_t)count * sizeof(float));
      if (copy != NULL) memcpy(copy, kv_scale_values, (size_t)count * sizeof(float));
    }
    free((float*)$self->kv_scales);
    $self->kv_scales = copy;
  }
  void forget_kv_scales() { $self->kv_scales = NULL; }
}

/* ---- one layer for a batch of sequences ---------------------------------- */
/* pq_select_item and pq_fetch_item embed a pq_tensor and a pq_selection by
 * value, which point at direct buffers: they are not wrapped as classes.
 * The idiomatic layer builds an item array in C memory with these helpers,
 * copying in the descriptors it already made for the per-sequence calls
 * (their buffers stay reachable until the batch returns), calls
 * pq_decode_select_batch / pq_fetch_kv_batch (which throw PqException like
 * every call) and reads each item's status back. */
%ignore pq_select_item;
%ignore pq_fetch_item;
%inline %{
/* NULL when count < 0 or the allocation fails (the Java side throws). */
pq_select_item* pqj_select_items_new(int64_t count) {
  return count < 0 ? NULL : (pq_select_item*)calloc(count > 0 ? (size_t)count : 1,
                                                     sizeof(pq_select_item));
}
void pqj_select_items_delete(pq_select_item* items) { free(items); }
void pqj_select_items_set(pq_select_item* items, int64_t i, uint64_t seq_id,
                          const pq_tensor* query, const pq_selection* out) {
  if (items == NULL || query == NULL || out == NULL) return; /* the Java side passes none */
  items[i].seq_id = seq_id;
  items[i].query = *query;
  items[i].out = *out;
  items[i].status = PQ_OK;
}
int32_t pqj_select_items_status(const pq_select_item* items, int64_t i) {
  return (int32_t)items[i].status;
}

pq_fetch_item* pqj_fetch_items_new(int64_t count) {
  return count < 0 ? NULL : (pq_fetch_item*)calloc(count > 0 ? (size_t)count : 1,
                                                    sizeof(pq_fetch_item));
}
void pqj_fetch_items_delete(pq_fetch_item* items) { free(items); }
void pqj_fetch_items_set(pq_fetch_item* items, int64_t i, uint64_t seq_id,
                         const pq_selection* selection, const pq_tensor* out_keys,
                         const pq_tensor* out_values) {
  if (items == NULL || selection == NULL || out_keys == NULL || out_values == NULL) return;
  items[i].seq_id = seq_id;
  items[i].selection = *selection;
  items[i].out_keys = *out_keys;
  items[i].out_values = *out_values;
  items[i].status = PQ_OK;
}
int32_t pqj_fetch_items_status(const pq_fetch_item* items, int64_t i) {
  return (int32_t)items[i].status;
}
%}
