/* python.i - what the Python module pqcache_swig adds to bindings/swig/pqcache.i.
 *
 * The generated module is the raw C API with Python types; the package
 * pqcache (bindings/python/pqcache) is the idiomatic layer on top.
 *
 *  - Arrays cross without copies: every tensor, selection, probability and
 *    index buffer parameter takes any object with the buffer protocol (numpy
 *    arrays, memoryviews), checked for dtype, shape and a contiguous last
 *    axis; the library reads or writes the caller's memory in place.
 *    Tensors are 3-D [tokens][heads][head_dim] with any non-negative strides
 *    (a head-major array passes as its transposed view). f32 is float32, f16
 *    float16, bf16 the raw bits as uint16. A selection is a pair (positions,
 *    counts): int32 arrays [kv_heads][capacity] and [kv_heads], C-contiguous.
 *    pq_decode_attend writes float32 arrays: out (num_q_heads x head_dim
 *    values) and out_lse (num_q_heads values, or None), C-contiguous.
 *  - A failing pq_status raises pqcache.PQError (status, status_name,
 *    message from pq_last_error); functions returning only a status return
 *    None, and out-parameters become return values. Malformed buffers raise
 *    TypeError or ValueError before the library is called.
 *  - Every library call runs with the GIL released, so Python threads
 *    prefill, select and fetch concurrently (the library is thread-safe; the
 *    buffers stay exported, so they cannot be freed or resized meanwhile).
 *
 * SWIG names the converted C arguments arg1..argN in the wrapper; the few
 * checks that need another argument (the context, the selection) use them.
 */

%{
#include <stdlib.h>
#include <string.h>

/* pqcache.PQError, created when the module is imported; named after the
 * package that exports it, so tracebacks and pickles say pqcache.PQError. */
static PyObject* pq_py_error_type = NULL;

/* Raises PQError for a failed call. Runs right after the call, on the same
 * thread, before any other library call: pq_last_error() is thread-local.
 * statuses, if not NULL, becomes the error's .statuses (a batch's item
 * statuses). */
static void pq_py_raise_with(pq_status status, PyObject* statuses) {
  const char* described = pq_status_string(status); /* "NAME: description" */
  const char* colon = strchr(described, ':');
  const char* message = pq_last_error();
  PyObject* name = colon ? PyUnicode_FromStringAndSize(described, colon - described)
                         : PyUnicode_FromString(described);
  PyObject* text = PyUnicode_DecodeUTF8(message, (Py_ssize_t)strlen(message), "replace");
  PyObject* code = PyLong_FromLong((long)status);
  PyObject* summary = (name && text) ? PyUnicode_FromFormat("%U: %U", name, text) : NULL;
  PyObject* error = summary ? PyObject_CallFunctionObjArgs(pq_py_error_type, summary, NULL) : NULL;
  if (error && code && name && text && PyObject_SetAttrString(error, "status", code) == 0 &&
      PyObject_SetAttrString(error, "status_name", name) == 0 &&
      PyObject_SetAttrString(error, "message", text) == 0 &&
      (statuses == NULL || PyObject_SetAttrString(error, "statuses", statuses) == 0)) {
    PyErr_SetObject(pq_py_error_type, error);
  } else if (!PyErr_Occurred()) {
    PyErr_NoMemory();
  }
  Py_XDECREF(error);
  Py_XDECREF(summary);
  Py_XDECREF(code);
  Py_XDECREF(text);
  Py_XDECREF(name);
}

static void pq_py_raise(pq_status status) { pq_py_raise_with(status, NULL); }

/* The element code of a buffer format ("f", "<f", "=e", ...), or 0 when the
 * byte order is not the machine's. */
static char pq_py_format_code(const char* format) {
  static const union { uint16_t word; unsigned char first; } probe = {1};
  const int little_endian = probe.first == 1;
  if (format == NULL) return 'B'; /* the buffer protocol's default: bytes */
  switch (format[0]) {
    case '@': case '=': return format[1] != '\0' && format[2] == '\0' ? format[1] : 0;
    case '<': return little_endian && format[1] != '\0' && format[2] == '\0' ? format[1] : 0;
    case '>': case '!': return !little_endian && format[1] != '\0' && format[2] == '\0' ? format[1] : 0;
    default: return format[1] == '\0' ? format[0] : 0;
  }
}

/* Exports input's buffer into *view (released by the caller with
 * PyBuffer_Release, also on failure). Raises TypeError for an object without
 * the buffer protocol, ValueError for a read-only one when writable. */
static int pq_py_get_buffer(PyObject* input, const char* name, int writable, Py_buffer* view) {
  if (!PyObject_CheckBuffer(input)) {
    PyErr_Format(PyExc_TypeError,
                 "%s: expected an array with the buffer protocol (numpy.ndarray, memoryview), "
                 "got %s", name, Py_TYPE(input)->tp_name);
    return -1;
  }
  int flags = PyBUF_STRIDES | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(input, view, flags) != 0) {
    if (writable) {
      PyErr_Clear();
      PyErr_Format(PyExc_ValueError,
                   "%s: the library writes into this array, but it is read-only", name);
    }
    return -1;
  }
  return 0;
}

/* A pq_tensor over a 3-D [tokens][heads][head_dim] buffer, without a copy. */
static int pq_py_tensor(PyObject* input, const char* name, int writable, Py_buffer* view,
                        pq_tensor* tensor) {
  if (pq_py_get_buffer(input, name, writable, view) != 0) return -1;
  if (view->ndim != 3) {
    PyErr_Format(PyExc_ValueError,
                 "%s: expected a 3-D array [tokens][heads][head_dim], got %d dimensions", name,
                 view->ndim);
    return -1;
  }
  int32_t dtype;
  Py_ssize_t item = view->itemsize;
  switch (pq_py_format_code(view->format)) {
    case 'f': dtype = PQ_DTYPE_F32; break;
    case 'e': dtype = PQ_DTYPE_F16; break;
    case 'H': dtype = PQ_DTYPE_BF16; break; /* bfloat16 as its raw uint16 bits */
    /* fp8 codes (0.10): pqcache/__init__.py hands e4m3 codes as uint8 and
     * e5m2 codes as an int8 view of them (the two are told apart so). */
    case 'B': dtype = PQ_DTYPE_FP8_E4M3; break;
    case 'b': dtype = PQ_DTYPE_FP8_E5M2; break;
    default:
      PyErr_Format(PyExc_TypeError,
                   "%s: unsupported element format '%s'; expected float32 (f32), float16 (f16), "
                   "uint16 holding bfloat16 bits (bf16) or uint8 fp8 codes, in native byte order",
                   name, view->format ? view->format : "B");
      return -1;
  }
  if (item != (dtype == PQ_DTYPE_F32 ? 4 : dtype == PQ_DTYPE_FP8_E4M3 || dtype == PQ_DTYPE_FP8_E5M2 ? 1 : 2)) {
    PyErr_Format(PyExc_TypeError, "%s: element size %zd does not match its format '%s'", name,
                 item, view->format);
    return -1;
  }
  /* A dimension of extent 1 has no meaningful stride (numpy may store any). */
  Py_ssize_t strides[3];
  for (int d = 0; d < 3; ++d) {
    strides[d] = view->shape[d] > 1 ? view->strides[d] : (d == 2 ? item : 0);
    if (strides[d] < 0 || strides[d] % item != 0) {
      PyErr_Format(PyExc_ValueError,
                   "%s: stride %zd bytes of axis %d is not a non-negative multiple of the "
                   "element size %zd (reversed or misaligned view); use numpy.ascontiguousarray",
                   name, view->strides[d], d, item);
      return -1;
    }
  }
  if (strides[2] != item) {
    PyErr_Format(PyExc_ValueError,
                 "%s: the last axis (head_dim) must be contiguous, but its stride is %zd bytes "
                 "for %zd-byte elements; use numpy.ascontiguousarray", name, view->strides[2],
                 item);
    return -1;
  }
  if (view->shape[1] > INT32_MAX || view->shape[2] > INT32_MAX) {
    PyErr_Format(PyExc_ValueError, "%s: heads and head_dim must fit in int32", name);
    return -1;
  }
  tensor->data = view->buf;
  tensor->dtype = dtype;
  tensor->memory = PQ_MEMORY_HOST;
  tensor->tokens = (int64_t)view->shape[0];
  tensor->heads = (int32_t)view->shape[1];
  tensor->head_dim = (int32_t)view->shape[2];
  tensor->token_stride = (int64_t)(strides[0] / item);
  tensor->head_stride = (int64_t)(strides[1] / item);
  return 0;
}

/* A C-contiguous buffer of int32 (format 'i', or 'l' where long has 4 bytes)
 * or float32 ('f') with the given number of dimensions (-1: any). */
static int pq_py_dense(PyObject* input, const char* name, int writable, char kind, int ndim,
                       Py_buffer* view) {
  if (pq_py_get_buffer(input, name, writable, view) != 0) return -1;
  char code = pq_py_format_code(view->format);
  int ok = view->itemsize == 4 &&
           (kind == 'f' ? code == 'f' : (code == 'i' || (code == 'l' && sizeof(long) == 4)));
  if (!ok) {
    PyErr_Format(PyExc_TypeError, "%s: expected %s elements in native byte order, got format "
                 "'%s'", name, kind == 'f' ? "float32" : "int32", view->format ? view->format : "B");
    return -1;
  }
  if (ndim >= 0 && view->ndim != ndim) {
    PyErr_Format(PyExc_ValueError, "%s: expected %d dimensions, got %d", name, ndim, view->ndim);
    return -1;
  }
  if (!PyBuffer_IsContiguous(view, 'C')) {
    PyErr_Format(PyExc_ValueError, "%s: must be C-contiguous; use numpy.ascontiguousarray",
                 name);
    return -1;
  }
  return 0;
}

/* A selection over the caller's (positions, counts) arrays. The pq_selection
 * comes first so that a pq_selection* points at the whole struct. */
typedef struct pq_py_selection {
  pq_selection selection;
  Py_buffer positions; /* int32 [rows][capacity] */
  Py_buffer counts;    /* int32 [rows] */
} pq_py_selection;

static int pq_py_selection_from(PyObject* input, const char* name, int writable,
                                pq_py_selection* out) {
  if (!PyTuple_Check(input) || PyTuple_GET_SIZE(input) != 2) {
    PyErr_Format(PyExc_TypeError,
                 "%s: expected a (positions, counts) tuple of int32 arrays, got %s", name,
                 Py_TYPE(input)->tp_name);
    return -1;
  }
  if (pq_py_dense(PyTuple_GET_ITEM(input, 0), "positions", writable, 'i', 2, &out->positions) ||
      pq_py_dense(PyTuple_GET_ITEM(input, 1), "counts", writable, 'i', 1, &out->counts))
    return -1;
  if (out->counts.shape[0] != out->positions.shape[0]) {
    PyErr_Format(PyExc_ValueError,
                 "%s: positions has %zd rows but counts has %zd entries; both need one per "
                 "kv head", name, out->positions.shape[0], out->counts.shape[0]);
    return -1;
  }
  out->selection.positions = (int32_t*)out->positions.buf;
  out->selection.counts = (int32_t*)out->counts.buf;
  out->selection.capacity = (int64_t)out->positions.shape[1];
  return 0;
}

static void pq_py_selection_release(pq_py_selection* s) {
  PyBuffer_Release(&s->positions);
  PyBuffer_Release(&s->counts);
}

/* The library reads or writes one row per kv head: fewer rows would overrun
 * the caller's arrays, so they are checked against the context. */
static int pq_py_check_selection_rows(const pq_context* ctx, const pq_py_selection* s) {
  pq_config config;
  if (ctx == NULL) return 0; /* the library reports the NULL context */
  pq_config_default(&config);
  pq_status status = pq_get_config(ctx, &config);
  if (status != PQ_OK) {
    pq_py_raise(status);
    return -1;
  }
  if (s->positions.shape[0] != config.num_kv_heads) {
    PyErr_Format(PyExc_ValueError,
                 "selection: positions and counts have %zd rows; the context has %d kv heads",
                 s->positions.shape[0], (int)config.num_kv_heads);
    return -1;
  }
  return 0;
}

/* pq_index_codes writes count * pq_subspaces bytes. */
static int pq_py_check_codes_size(const pq_context* ctx, int64_t count, const Py_buffer* out) {
  pq_config config;
  if (ctx == NULL || count < 0) return 0; /* the library reports these */
  pq_config_default(&config);
  pq_status status = pq_get_config(ctx, &config);
  if (status != PQ_OK) {
    pq_py_raise(status);
    return -1;
  }
  if (out->len < count * (int64_t)config.pq_subspaces) {
    PyErr_Format(PyExc_ValueError,
                 "out: %zd bytes cannot hold the codes of %lld tokens x %d subspaces", out->len,
                 (long long)count, (int)config.pq_subspaces);
    return -1;
  }
  return 0;
}

/* pq_decode_attend writes num_q_heads * head_dim floats to out and
 * num_q_heads floats to out_lse (per_head: 1 for out_lse). */
static int pq_py_check_attend_output(const pq_context* ctx, const Py_buffer* view,
                                     const char* name, int per_head_dim) {
  pq_config config;
  if (ctx == NULL || view->buf == NULL) return 0; /* the library reports NULL ctx, out */
  pq_config_default(&config);
  pq_status status = pq_get_config(ctx, &config);
  if (status != PQ_OK) {
    pq_py_raise(status);
    return -1;
  }
  Py_ssize_t needed = (Py_ssize_t)config.num_q_heads * (per_head_dim ? config.head_dim : 1);
  if (view->len / 4 < needed) {
    PyErr_Format(PyExc_ValueError,
                 "%s: %zd float32 values cannot hold %s (%zd); the context has %d q heads of "
                 "head_dim %d", name, view->len / 4,
                 per_head_dim ? "num_q_heads x head_dim" : "num_q_heads", needed,
                 (int)config.num_q_heads, (int)config.head_dim);
    return -1;
  }
  return 0;
}

/* --- one layer for a batch of sequences ----------------------------------- */
/* pq_decode_select_batch and pq_fetch_kv_batch over Python sequences: one
 * item per seq_id, each built from the same arrays the per-sequence calls
 * take, all exported for the call and run without the GIL. Returns the list
 * of item statuses (all 0). A failing call raises PQError; when items ran,
 * the error has .statuses (0 for the items that succeeded; their outputs
 * are written). */
typedef struct pq_py_batch {
  Py_ssize_t count;
  PyObject* seq_ids; /* PySequence_Fast of the arguments */
  PyObject* first;   /* queries or selections */
  PyObject* second;  /* select: outs; fetch: out_keys */
  PyObject* third;   /* fetch: out_values */
  Py_buffer* views;  /* views_per_item tensors per item, zeroed */
  int views_per_item;
  pq_py_selection* selections; /* one per item, zeroed */
} pq_py_batch;

static void pq_py_batch_release(pq_py_batch* b) {
  if (b->views != NULL) {
    for (Py_ssize_t i = 0; i < b->count * b->views_per_item; ++i) PyBuffer_Release(&b->views[i]);
    PyMem_Free(b->views);
  }
  if (b->selections != NULL) {
    for (Py_ssize_t i = 0; i < b->count; ++i) pq_py_selection_release(&b->selections[i]);
    PyMem_Free(b->selections);
  }
  Py_XDECREF(b->seq_ids);
  Py_XDECREF(b->first);
  Py_XDECREF(b->second);
  Py_XDECREF(b->third);
}

/* Takes the argument sequences (third may be NULL), checks that they have
 * one entry per seq_id, and allocates the views and selections. */
static int pq_py_batch_begin(pq_py_batch* b, int views_per_item, PyObject* seq_ids,
                             PyObject* first, const char* first_name, PyObject* second,
                             const char* second_name, PyObject* third, const char* third_name) {
  PyObject* const args[3] = {first, second, third};
  const char* const names[3] = {first_name, second_name, third_name};
  PyObject** const slots[3] = {&b->first, &b->second, &b->third};
  memset(b, 0, sizeof *b);
  b->views_per_item = views_per_item;
  b->seq_ids = PySequence_Fast(seq_ids, "seq_ids: expected a sequence of ints");
  if (b->seq_ids == NULL) return -1;
  b->count = PySequence_Fast_GET_SIZE(b->seq_ids);
  for (int a = 0; a < 3 && args[a] != NULL; ++a) {
    *slots[a] = PySequence_Fast(args[a], names[a]);
    if (*slots[a] == NULL) return -1;
    if (PySequence_Fast_GET_SIZE(*slots[a]) != b->count) {
      PyErr_Format(PyExc_ValueError, "%s has %zd entries for %zd seq_ids; expected one each",
                   names[a], PySequence_Fast_GET_SIZE(*slots[a]), b->count);
      return -1;
    }
  }
  b->views = (Py_buffer*)PyMem_Calloc((size_t)(b->count > 0 ? b->count : 1) * views_per_item,
                                      sizeof(Py_buffer));
  b->selections = (pq_py_selection*)PyMem_Calloc((size_t)(b->count > 0 ? b->count : 1),
                                                 sizeof(pq_py_selection));
  if (b->views == NULL || b->selections == NULL) {
    PyErr_NoMemory();
    return -1;
  }
  return 0;
}

static int pq_py_seq_id(pq_py_batch* b, Py_ssize_t i, uint64_t* out) {
  unsigned long long id = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(b->seq_ids, i));
  if (id == (unsigned long long)-1 && PyErr_Occurred()) return -1;
  *out = (uint64_t)id;
  return 0;
}

/* Item i's selection, from the argument sequence `arg` (released with the
 * batch, also on failure). */
static int pq_py_batch_selection(pq_py_batch* b, Py_ssize_t i, const pq_context* ctx,
                                 PyObject* arg, const char* name, int writable,
                                 pq_selection* out) {
  pq_py_selection* s = &b->selections[i];
  if (pq_py_selection_from(PySequence_Fast_GET_ITEM(arg, i), name, writable, s) != 0 ||
      pq_py_check_selection_rows(ctx, s) != 0)
    return -1;
  *out = s->selection;
  return 0;
}

/* After the call: the statuses as a list, or an error. Items that ran have
 * a status; a call-level error wrote none (all still PQ_OK). */
static PyObject* pq_py_batch_end(pq_status status, const pq_status* statuses, Py_ssize_t count) {
  int items_ran = 0;
  PyObject* list = PyList_New(count);
  if (list == NULL) return NULL;
  for (Py_ssize_t i = 0; i < count; ++i) {
    PyObject* code = PyLong_FromLong((long)statuses[i]);
    if (code == NULL) {
      Py_DECREF(list);
      return NULL;
    }
    PyList_SET_ITEM(list, i, code);
    items_ran |= statuses[i] != PQ_OK;
  }
  if (status == PQ_OK) return list;
  pq_py_raise_with(status, items_ran ? list : NULL);
  Py_DECREF(list);
  return NULL;
}

static PyObject* pq_py_decode_select_batch(pq_context* ctx, int32_t layer, PyObject* seq_ids,
                                           PyObject* queries, PyObject* outs) {
  pq_py_batch b;
  pq_select_item* items = NULL;
  pq_status* statuses = NULL;
  PyObject* result = NULL;
  if (pq_py_batch_begin(&b, 1, seq_ids, queries, "queries: expected a sequence of arrays", outs,
                        "outs: expected a sequence of (positions, counts)", NULL, NULL) != 0)
    goto done;
  items = (pq_select_item*)PyMem_Calloc((size_t)(b.count > 0 ? b.count : 1), sizeof *items);
  statuses = (pq_status*)PyMem_Calloc((size_t)(b.count > 0 ? b.count : 1), sizeof *statuses);
  if (items == NULL || statuses == NULL) {
    PyErr_NoMemory();
    goto done;
  }
  for (Py_ssize_t i = 0; i < b.count; ++i) {
    if (pq_py_seq_id(&b, i, &items[i].seq_id) != 0 ||
        pq_py_tensor(PySequence_Fast_GET_ITEM(b.first, i), "query", 0, &b.views[i],
                     &items[i].query) != 0 ||
        pq_py_batch_selection(&b, i, ctx, b.second, "out", 1, &items[i].out) != 0)
      goto done;
    items[i].status = PQ_OK;
  }
  {
    pq_status status;
    Py_BEGIN_ALLOW_THREADS
    status = pq_decode_select_batch(ctx, layer, items, (int64_t)b.count);
    Py_END_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < b.count; ++i) statuses[i] = items[i].status;
    result = pq_py_batch_end(status, statuses, b.count);
  }
done:
  PyMem_Free(items);
  PyMem_Free(statuses);
  pq_py_batch_release(&b);
  return result;
}

static PyObject* pq_py_fetch_kv_batch(pq_context* ctx, int32_t layer, PyObject* seq_ids,
                                      PyObject* selections, PyObject* out_keys,
                                      PyObject* out_values) {
  pq_py_batch b;
  pq_fetch_item* items = NULL;
  pq_status* statuses = NULL;
  PyObject* result = NULL;
  if (pq_py_batch_begin(&b, 2, seq_ids, selections,
                        "selections: expected a sequence of (positions, counts)", out_keys,
                        "out_keys: expected a sequence of arrays", out_values,
                        "out_values: expected a sequence of arrays") != 0)
    goto done;
  items = (pq_fetch_item*)PyMem_Calloc((size_t)(b.count > 0 ? b.count : 1), sizeof *items);
  statuses = (pq_status*)PyMem_Calloc((size_t)(b.count > 0 ? b.count : 1), sizeof *statuses);
  if (items == NULL || statuses == NULL) {
    PyErr_NoMemory();
    goto done;
  }
  for (Py_ssize_t i = 0; i < b.count; ++i) {
    Py_buffer* views = &b.views[2 * i];
    if (pq_py_seq_id(&b, i, &items[i].seq_id) != 0 ||
        pq_py_batch_selection(&b, i, ctx, b.first, "selection", 0, &items[i].selection) != 0 ||
        pq_py_tensor(PySequence_Fast_GET_ITEM(b.second, i), "out_keys", 1, &views[0],
                     &items[i].out_keys) != 0 ||
        pq_py_tensor(PySequence_Fast_GET_ITEM(b.third, i), "out_values", 1, &views[1],
                     &items[i].out_values) != 0)
      goto done;
    items[i].status = PQ_OK;
  }
  {
    pq_status status;
    Py_BEGIN_ALLOW_THREADS
    status = pq_fetch_kv_batch(ctx, layer, items, (int64_t)b.count);
    Py_END_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < b.count; ++i) statuses[i] = items[i].status;
    result = pq_py_batch_end(status, statuses, b.count);
  }
done:
  PyMem_Free(items);
  PyMem_Free(statuses);
  pq_py_batch_release(&b);
  return result;
}

/* --- sequence state: save to bytes ---------------------------------------- */
/* pq_sequence_state_size, then pq_sequence_save_buffer straight into a new
 * bytes object (no copy), sized again when the library asks for more (only
 * a call racing with the save, which pqcache.h forbids, makes the sequence
 * grow). Both calls run without the GIL. */
static PyObject* pq_py_sequence_save_bytes(pq_context* ctx, uint64_t seq_id) {
  uint64_t size = 0, written = 0;
  pq_status status;
  Py_BEGIN_ALLOW_THREADS
  status = pq_sequence_state_size(ctx, seq_id, &size);
  Py_END_ALLOW_THREADS
  if (status != PQ_OK) {
    pq_py_raise(status);
    return NULL;
  }
  for (int attempt = 1;; ++attempt) {
    PyObject* state;
    if (size > (uint64_t)PY_SSIZE_T_MAX) {
      PyErr_Format(PyExc_MemoryError, "a saved state of %llu bytes does not fit in bytes",
                   (unsigned long long)size);
      return NULL;
    }
    state = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
    if (state == NULL) return NULL;
    {
      char* buffer = PyBytes_AS_STRING(state);
      Py_BEGIN_ALLOW_THREADS
      status = pq_sequence_save_buffer(ctx, seq_id, buffer, size, &written);
      Py_END_ALLOW_THREADS
    }
    if (status == PQ_OK) {
      if (written > size) {
        Py_DECREF(state);
        PyErr_Format(PyExc_RuntimeError,
                     "pq_sequence_save_buffer reported %llu bytes written into %llu",
                     (unsigned long long)written, (unsigned long long)size);
        return NULL;
      }
      if (written < size && _PyBytes_Resize(&state, (Py_ssize_t)written) != 0) return NULL;
      return state;
    }
    Py_DECREF(state);
    if (status != PQ_ERR_BUFFER_TOO_SMALL || attempt == 3) {
      pq_py_raise(status);
      return NULL;
    }
    size = written; /* the size needed now */
  }
}

/* --- sequence state: a restore in pieces ---------------------------------- */
/* pq_sequence_restore_begin or _kv over data, without the GIL: the bytes
 * read as an int. PQ_ERR_BUFFER_TOO_SMALL raises PQError with .needed, the
 * bytes the call needs from data's start (what it wrote into *out_consumed,
 * which the status typemap would drop). */
typedef pq_status (*pq_py_restore_fn)(pq_context*, uint64_t, const void*, uint64_t, uint64_t*);
static PyObject* pq_py_restore_step(pq_py_restore_fn fn, pq_context* ctx, uint64_t seq_id,
                                    const void* data, uint64_t size) {
  uint64_t consumed = 0;
  pq_status status;
  Py_BEGIN_ALLOW_THREADS
  status = fn(ctx, seq_id, data, size, &consumed);
  Py_END_ALLOW_THREADS
  if (status == PQ_OK) return PyLong_FromUnsignedLongLong((unsigned long long)consumed);
  pq_py_raise(status);
  if (status == PQ_ERR_BUFFER_TOO_SMALL) {
    PyObject *type, *value, *traceback, *needed;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    needed = PyLong_FromUnsignedLongLong((unsigned long long)consumed);
    if (needed == NULL || value == NULL || PyObject_SetAttrString(value, "needed", needed) != 0) {
      Py_XDECREF(needed);
      Py_XDECREF(type);
      Py_XDECREF(value);
      Py_XDECREF(traceback);
      return NULL; /* the error of the failed step is set */
    }
    Py_DECREF(needed);
    PyErr_Restore(type, value, traceback);
  }
  return NULL;
}
static PyObject* pq_py_sequence_restore_begin(pq_context* ctx, uint64_t seq_id,
                                              const void* data, uint64_t size) {
  return pq_py_restore_step(pq_sequence_restore_begin, ctx, seq_id, data, size);
}
static PyObject* pq_py_sequence_restore_kv(pq_context* ctx, uint64_t seq_id,
                                           const void* data, uint64_t size) {
  return pq_py_restore_step(pq_sequence_restore_kv, ctx, seq_id, data, size);
}

/* The decode step kept on the device (0.7): device memory has no buffer
 * protocol, so the Python layer (pqcache.DeviceSelection) reads each device
 * array's address, shape and strides (__cuda_array_interface__, or a torch
 * tensor's data_ptr) and passes them here as integers. */
static pq_status pq_py_decode_select_device(pq_context* ctx, uint64_t seq_id, int32_t layer,
                                            uint64_t query_data, int32_t query_dtype,
                                            int32_t q_heads, int32_t head_dim,
                                            int64_t query_head_stride, uint64_t positions,
                                            uint64_t counts, int64_t capacity) {
  pq_tensor query = {(void*)(uintptr_t)query_data, query_dtype, PQ_MEMORY_DEVICE, 1, q_heads,
                     head_dim, (int64_t)q_heads * query_head_stride, query_head_stride};
  pq_selection out = {(int32_t*)(uintptr_t)positions, (int32_t*)(uintptr_t)counts, capacity};
  return pq_decode_select_device(ctx, seq_id, layer, &query, &out);
}
/* pq_decode_select_multi_device (0.10): queries [tokens][q_heads][head_dim]
 * and the rows' arrays, device addresses as above. */
static pq_status pq_py_decode_select_multi_device(pq_context* ctx, uint64_t seq_id,
                                                  int32_t layer, uint64_t query_data,
                                                  int32_t query_dtype, int64_t tokens,
                                                  int32_t q_heads, int32_t head_dim,
                                                  int64_t token_stride, int64_t head_stride,
                                                  int32_t rows, uint64_t positions,
                                                  uint64_t counts, int64_t capacity) {
  pq_tensor queries = {(void*)(uintptr_t)query_data, query_dtype, PQ_MEMORY_DEVICE, tokens,
                       q_heads, head_dim, token_stride, head_stride};
  pq_selection out = {(int32_t*)(uintptr_t)positions, (int32_t*)(uintptr_t)counts, capacity};
  return pq_decode_select_multi_device(ctx, seq_id, layer, &queries, rows, &out);
}
static pq_status pq_py_fetch_kv_device(pq_context* ctx, uint64_t seq_id, int32_t layer,
                                       uint64_t positions, uint64_t counts, int64_t capacity,
                                       uint64_t keys, uint64_t values, int32_t dtype,
                                       int64_t tokens, int32_t heads, int32_t head_dim,
                                       int64_t token_stride, int64_t head_stride) {
  pq_selection selection = {(int32_t*)(uintptr_t)positions, (int32_t*)(uintptr_t)counts,
                            capacity};
  pq_tensor k = {(void*)(uintptr_t)keys, dtype, PQ_MEMORY_DEVICE, tokens, heads, head_dim,
                 token_stride, head_stride};
  pq_tensor v = k;
  v.data = (void*)(uintptr_t)values;
  return pq_fetch_kv_device(ctx, seq_id, layer, &selection, &k, &v);
}

/* The batched device step (0.8): one tuple of integers per item, the
 * per-sequence call's arguments above (pqcache.device builds them), so that
 * no Python object is touched without the GIL. Returns the item statuses,
 * as pq_py_decode_select_batch does. */
static PyObject* pq_py_device_batch(pq_context* ctx, int32_t layer, PyObject* rows, int select) {
  PyObject* fast = PySequence_Fast(rows, "items: expected a sequence of tuples");
  if (fast == NULL) return NULL;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  const size_t size = select ? sizeof(pq_select_item) : sizeof(pq_fetch_item);
  void* items = PyMem_Calloc((size_t)(n > 0 ? n : 1), size);
  pq_status* statuses = (pq_status*)PyMem_Calloc((size_t)(n > 0 ? n : 1), sizeof *statuses);
  PyObject* result = NULL;
  if (items == NULL || statuses == NULL) {
    PyErr_NoMemory();
    goto done;
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* t = PySequence_Fast_GET_ITEM(fast, i);
    unsigned long long id, a, b, c;
    int dtype, heads, dim;
    long long stride, capacity;
    if (select) {
      pq_select_item* it = (pq_select_item*)items + i;
      if (!PyArg_ParseTuple(t, "KKiiiLKKL", &id, &a, &dtype, &heads, &dim, &stride, &b, &c,
                            &capacity))
        goto done;
      pq_tensor q = {(void*)(uintptr_t)a, dtype, PQ_MEMORY_DEVICE, 1, heads, dim,
                     (int64_t)heads * stride, stride};
      it->seq_id = id;
      it->query = q;
      it->out.positions = (int32_t*)(uintptr_t)b;
      it->out.counts = (int32_t*)(uintptr_t)c;
      it->out.capacity = capacity;
    } else {
      pq_fetch_item* it = (pq_fetch_item*)items + i;
      unsigned long long keys, values;
      long long tokens, token_stride, head_stride;
      if (!PyArg_ParseTuple(t, "KKKLKKiLiiLL", &id, &a, &b, &capacity, &keys, &values, &dtype,
                            &tokens, &heads, &dim, &token_stride, &head_stride))
        goto done;
      pq_tensor k = {(void*)(uintptr_t)keys, dtype, PQ_MEMORY_DEVICE, tokens, heads, dim,
                     token_stride, head_stride};
      it->seq_id = id;
      it->selection.positions = (int32_t*)(uintptr_t)a;
      it->selection.counts = (int32_t*)(uintptr_t)b;
      it->selection.capacity = capacity;
      it->out_keys = k;
      it->out_values = k;
      it->out_values.data = (void*)(uintptr_t)values;
    }
  }
  {
    pq_status status;
    Py_BEGIN_ALLOW_THREADS
    status = select ? pq_decode_select_device_batch(ctx, layer, (pq_select_item*)items, (int64_t)n)
                    : pq_fetch_kv_device_batch(ctx, layer, (pq_fetch_item*)items, (int64_t)n);
    Py_END_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; ++i)
      statuses[i] = select ? ((pq_select_item*)items)[i].status : ((pq_fetch_item*)items)[i].status;
    result = pq_py_batch_end(status, statuses, n);
  }
done:
  PyMem_Free(items);
  PyMem_Free(statuses);
  Py_DECREF(fast);
  return result;
}
static PyObject* pq_py_decode_select_device_batch(pq_context* ctx, int32_t layer, PyObject* items) {
  return pq_py_device_batch(ctx, layer, items, 1);
}
static PyObject* pq_py_fetch_kv_device_batch(pq_context* ctx, int32_t layer, PyObject* items) {
  return pq_py_device_batch(ctx, layer, items, 0);
}

/* --- the index-only tier (0.10): keys in the caller's pool, several query
 * tokens in one select ------------------------------------------------------ */
/* A 1-D C-contiguous buffer of `bytes`-byte signed integers (int32: 'i', or
 * 'l' where long has 4 bytes; int64: 'q', or 'l' where long has 8). */
static int pq_py_index_array(PyObject* input, const char* name, int bytes, Py_buffer* view) {
  if (pq_py_get_buffer(input, name, 0, view) != 0) return -1;
  char code = pq_py_format_code(view->format);
  int ok = view->itemsize == bytes &&
           (code == (bytes == 4 ? 'i' : 'q') || (code == 'l' && sizeof(long) == (size_t)bytes));
  if (!ok) {
    PyErr_Format(PyExc_TypeError, "%s: expected int%d elements in native byte order, got format "
                 "'%s'", name, bytes * 8, view->format ? view->format : "B");
    return -1;
  }
  if (view->ndim != 1 || !PyBuffer_IsContiguous(view, 'C')) {
    PyErr_Format(PyExc_ValueError, "%s: expected a C-contiguous 1-D array, got %d dimensions",
                 name, view->ndim);
    return -1;
  }
  return 0;
}

/* A pq_paged_keys over the caller's pool and map, without a copy: pool
 * [slots][kv_heads][head_dim], slots int64 (or None), block_table int32 (or
 * None); both None is the dense map (slot p is row p). The buffers stay
 * exported until pq_py_paged_release. */
typedef struct pq_py_paged {
  pq_paged_keys keys;
  Py_buffer pool, slots, table;
} pq_py_paged;

static int pq_py_paged_from(PyObject* pool, PyObject* slots, PyObject* block_table,
                            int32_t block_size, int64_t tokens, pq_py_paged* out) {
  memset(out, 0, sizeof *out);
  if (pq_py_tensor(pool, "pool", 0, &out->pool, &out->keys.pool) != 0) return -1;
  if (slots != Py_None) {
    if (pq_py_index_array(slots, "slots", 8, &out->slots) != 0) return -1;
    out->keys.slots = (const int64_t*)out->slots.buf;
    out->keys.map_length = (int64_t)out->slots.shape[0];
  }
  if (block_table != Py_None) {
    if (pq_py_index_array(block_table, "block_table", 4, &out->table) != 0) return -1;
    out->keys.block_table = (const int32_t*)out->table.buf;
    out->keys.map_length = (int64_t)out->table.shape[0];
  }
  out->keys.block_size = block_size;
  out->keys.tokens = tokens;
  return 0;
}

static void pq_py_paged_release(pq_py_paged* p) {
  PyBuffer_Release(&p->pool);
  PyBuffer_Release(&p->slots);
  PyBuffer_Release(&p->table);
}

/* pq_prefill_layer_paged / pq_decode_append_paged(ctx, seq_id, layer, pool,
 * slots, block_table, block_size, tokens). */
static PyObject* pq_py_paged_call(int append, pq_context* ctx, uint64_t seq_id, int32_t layer,
                                  PyObject* pool, PyObject* slots, PyObject* block_table,
                                  int32_t block_size, int64_t tokens) {
  pq_py_paged paged;
  pq_status status;
  if (pq_py_paged_from(pool, slots, block_table, block_size, tokens, &paged) != 0) {
    pq_py_paged_release(&paged);
    return NULL;
  }
  Py_BEGIN_ALLOW_THREADS
  status = append ? pq_decode_append_paged(ctx, seq_id, layer, &paged.keys)
                  : pq_prefill_layer_paged(ctx, seq_id, layer, &paged.keys);
  Py_END_ALLOW_THREADS
  pq_py_paged_release(&paged);
  if (status != PQ_OK) {
    pq_py_raise(status);
    return NULL;
  }
  Py_RETURN_NONE;
}
static PyObject* pq_py_prefill_layer_paged(pq_context* ctx, uint64_t seq_id, int32_t layer,
                                           PyObject* pool, PyObject* slots,
                                           PyObject* block_table, int32_t block_size,
                                           int64_t tokens) {
  return pq_py_paged_call(0, ctx, seq_id, layer, pool, slots, block_table, block_size, tokens);
}
static PyObject* pq_py_decode_append_paged(pq_context* ctx, uint64_t seq_id, int32_t layer,
                                           PyObject* pool, PyObject* slots,
                                           PyObject* block_table, int32_t block_size,
                                           int64_t tokens) {
  return pq_py_paged_call(1, ctx, seq_id, layer, pool, slots, block_table, block_size, tokens);
}

/* pq_decode_select_multi(ctx, seq_id, layer, queries, rows, out, pool,
 * slots, block_table, block_size): out is (positions, counts), int32
 * [rows][capacity] and [rows], with exactly the rows the form writes
 * (checked here: the library writes them all); pool None passes no keys. */
static PyObject* pq_py_decode_select_multi(pq_context* ctx, uint64_t seq_id, int32_t layer,
                                           PyObject* queries, int32_t rows, PyObject* out,
                                           PyObject* pool, PyObject* slots,
                                           PyObject* block_table, int32_t block_size) {
  Py_buffer query_view = {0};
  pq_tensor query;
  pq_py_selection selection = {{0}, {0}, {0}};
  pq_py_paged paged;
  int have_keys = pool != Py_None;
  PyObject* result = NULL;
  memset(&paged, 0, sizeof paged);
  if (pq_py_tensor(queries, "queries", 0, &query_view, &query) != 0 ||
      pq_py_selection_from(out, "out", 1, &selection) != 0 ||
      (have_keys && pq_py_paged_from(pool, slots, block_table, block_size, 0, &paged) != 0))
    goto done;
  if (ctx != NULL && rows >= PQ_ROWS_PER_TOKEN && rows <= PQ_ROWS_PER_REQUEST) {
    pq_config config;
    pq_status status;
    Py_ssize_t want;
    pq_config_default(&config);
    status = pq_get_config(ctx, &config);
    if (status != PQ_OK) {
      pq_py_raise(status);
      goto done;
    }
    want = rows == PQ_ROWS_PER_TOKEN ? (Py_ssize_t)query.tokens * config.num_kv_heads
         : rows == PQ_ROWS_PER_HEAD  ? (Py_ssize_t)config.num_kv_heads : 1;
    if (selection.positions.shape[0] != want) {
      PyErr_Format(PyExc_ValueError,
                   "out: positions and counts have %zd rows; this form writes %zd for %lld "
                   "query tokens and %d kv heads (pq_selection_capacity_multi)",
                   selection.positions.shape[0], want, (long long)query.tokens,
                   (int)config.num_kv_heads);
      goto done;
    }
  }
  {
    pq_status status;
    Py_BEGIN_ALLOW_THREADS
    status = pq_decode_select_multi(ctx, seq_id, layer, &query, rows,
                                    have_keys ? &paged.keys : NULL, &selection.selection);
    Py_END_ALLOW_THREADS
    if (status != PQ_OK) {
      pq_py_raise(status);
      goto done;
    }
  }
  Py_INCREF(Py_None);
  result = Py_None;
done:
  PyBuffer_Release(&query_view);
  pq_py_selection_release(&selection);
  pq_py_paged_release(&paged);
  return result;
}
%}

%init %{
  pq_py_error_type = PyErr_NewExceptionWithDoc(
      "pqcache.PQError",
      "A libpqcache call failed: .status (the pq_status, negative), .status_name\n"
      "(\"PQ_ERR_...\") and .message (pq_last_error() of the failing call).",
      PyExc_RuntimeError, NULL);
  if (pq_py_error_type == NULL || PyModule_AddObject(m, "PQError", pq_py_error_type) != 0)
    return NULL;
  Py_INCREF(pq_py_error_type); /* PyModule_AddObject stole one reference */
%}

%pythoncode %{
PQError = _pqcache_swig.PQError
%}

/* --- hooks (pq_create_with_hooks) from Python callables -------------------- */
%{
/* The library calls the hooks on its own threads (a build's worker) or on
 * the thread of a call, which runs without the GIL: each call takes the GIL.
 * An exception in a hook is reported (sys.unraisablehook) and goes no
 * further: the library has no way to take it. While the interpreter shuts
 * down, hooks are dropped (the GIL may never come back). */
#if PY_VERSION_HEX >= 0x030D0000
#define PQ_PY_FINALIZING() Py_IsFinalizing()
#else
#define PQ_PY_FINALIZING() _Py_IsFinalizing()
#endif

typedef struct pq_py_hooks {
  pq_hooks hooks;
  PyObject* log;        /* callable(level, message), or NULL */
  PyObject* build_done; /* callable(seq_id, layer, status), or NULL */
  PyObject* build_progress; /* callable(seq_id, layer, stage, done, total, fraction), or NULL */
} pq_py_hooks;

/* Calls fn(*args) (args: a new reference, or NULL after a failed build of
 * it); holds the GIL. */
static void pq_py_call_hook(PyObject* fn, PyObject* args) {
  PyObject* result = args ? PyObject_CallObject(fn, args) : NULL;
  if (result == NULL) PyErr_WriteUnraisable(fn);
  Py_XDECREF(result);
  Py_XDECREF(args);
}

static void pq_py_log_hook(void* user, int32_t level, const char* message) {
  if (PQ_PY_FINALIZING()) return;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* text = PyUnicode_DecodeUTF8(message, (Py_ssize_t)strlen(message), "replace");
  pq_py_call_hook(((pq_py_hooks*)user)->log, text ? Py_BuildValue("(iN)", (int)level, text) : NULL);
  PyGILState_Release(gil);
}

static void pq_py_build_done_hook(void* user, uint64_t seq_id, int32_t layer, pq_status status) {
  if (PQ_PY_FINALIZING()) return;
  PyGILState_STATE gil = PyGILState_Ensure();
  pq_py_call_hook(((pq_py_hooks*)user)->build_done,
                  Py_BuildValue("(Kii)", (unsigned long long)seq_id, (int)layer, (int)status));
  PyGILState_Release(gil);
}

static void pq_py_build_progress_hook(void* user, const pq_build_progress* p) {
  if (PQ_PY_FINALIZING()) return;
  PyGILState_STATE gil = PyGILState_Ensure();
  pq_py_call_hook(((pq_py_hooks*)user)->build_progress,
                  Py_BuildValue("(KiiLLd)", (unsigned long long)p->seq_id, (int)p->layer,
                                (int)p->stage, (long long)p->done, (long long)p->total,
                                p->fraction));
  PyGILState_Release(gil);
}
%}

/* The library calls run without the GIL; the typemaps around them hold it. */
%exception {
  Py_BEGIN_ALLOW_THREADS
  $action
  Py_END_ALLOW_THREADS
}

/* Statuses become exceptions; success returns None (or the out-parameters). */
%typemap(out) pq_status {
  if ($1 != PQ_OK) {
    pq_py_raise($1);
    SWIG_fail;
  }
  $result = SWIG_Py_Void();
}

/* --- tensors ------------------------------------------------------------- */
%typemap(in) const pq_tensor* keys (Py_buffer view = {0}, pq_tensor tensor),
             const pq_tensor* query (Py_buffer view = {0}, pq_tensor tensor),
             const pq_tensor* query_estimate (Py_buffer view = {0}, pq_tensor tensor),
             const pq_tensor* queries (Py_buffer view = {0}, pq_tensor tensor) {
  if (pq_py_tensor($input, "$1_name", 0, &view, &tensor) != 0) SWIG_fail;
  $1 = &tensor;
}
/* values: None passes NULL, for an index-only context (PQ_KV_TIER_CALLER),
 * which reads no values; other contexts answer PQ_ERR_INVALID_ARGUMENT. */
%typemap(in) const pq_tensor* values (Py_buffer view = {0}, pq_tensor tensor) {
  $1 = NULL;
  if ($input != Py_None) {
    if (pq_py_tensor($input, "$1_name", 0, &view, &tensor) != 0) SWIG_fail;
    $1 = &tensor;
  }
}
%typemap(in) const pq_tensor* out_keys (Py_buffer view = {0}, pq_tensor tensor),
             const pq_tensor* out_values (Py_buffer view = {0}, pq_tensor tensor) {
  if (pq_py_tensor($input, "$1_name", 1, &view, &tensor) != 0) SWIG_fail;
  $1 = &tensor;
}
%typemap(freearg) const pq_tensor* keys, const pq_tensor* values, const pq_tensor* query,
                  const pq_tensor* query_estimate, const pq_tensor* queries,
                  const pq_tensor* out_keys,
                  const pq_tensor* out_values {
  PyBuffer_Release(&view$argnum);
}
/* Python passes arrays where C passes pq_tensor and pq_selection structs:
 * the structs, and pq_tensor_init's void*, have no use there. */
%ignore pq_tensor;
%ignore pq_tensor_init;

/* --- selections: (positions, counts) ------------------------------------- */
%ignore pq_selection;
%typemap(in) pq_selection* out (pq_py_selection arrays = {{0}, {0}, {0}}) {
  if (pq_py_selection_from($input, "out", 1, &arrays) != 0) SWIG_fail;
  $1 = &arrays.selection;
}
%typemap(in) const pq_selection* selection (pq_py_selection arrays = {{0}, {0}, {0}}) {
  if (pq_py_selection_from($input, "selection", 0, &arrays) != 0) SWIG_fail;
  $1 = &arrays.selection;
}
%typemap(check) pq_selection* out, const pq_selection* selection {
  if (pq_py_check_selection_rows(arg1, &arrays$argnum) != 0) SWIG_fail;
}
%typemap(freearg) pq_selection* out, const pq_selection* selection {
  pq_py_selection_release(&arrays$argnum);
}

/* --- one layer for a batch of sequences ----------------------------------- */
/* The item structs point at the caller's buffers, so they are not wrapped:
 * pq_decode_select_batch(ctx, layer, seq_ids, queries, outs) and
 * pq_fetch_kv_batch(ctx, layer, seq_ids, selections, out_keys, out_values)
 * take one entry per sequence in each argument (the arrays the
 * per-sequence calls take) and return the item statuses; see
 * pq_py_decode_select_batch above. They release the GIL themselves. */
%ignore pq_select_item;
%ignore pq_fetch_item;
%ignore pq_decode_select_batch;
%ignore pq_fetch_kv_batch;
/* The decode step kept on the device: addresses in, see above. */
%ignore pq_decode_select_device;
%ignore pq_fetch_kv_device;
%rename(pq_decode_select_device) pq_py_decode_select_device;
%rename(pq_fetch_kv_device) pq_py_fetch_kv_device;
%ignore pq_decode_select_multi_device;
%rename(pq_decode_select_multi_device) pq_py_decode_select_multi_device;
pq_status pq_py_decode_select_multi_device(pq_context* ctx, uint64_t seq_id, int32_t layer,
                                           uint64_t query_data, int32_t query_dtype,
                                           int64_t tokens, int32_t q_heads, int32_t head_dim,
                                           int64_t token_stride, int64_t head_stride,
                                           int32_t rows, uint64_t positions, uint64_t counts,
                                           int64_t capacity);
pq_status pq_py_decode_select_device(pq_context* ctx, uint64_t seq_id, int32_t layer,
                                     uint64_t query_data, int32_t query_dtype, int32_t q_heads,
                                     int32_t head_dim, int64_t query_head_stride,
                                     uint64_t positions, uint64_t counts, int64_t capacity);
pq_status pq_py_fetch_kv_device(pq_context* ctx, uint64_t seq_id, int32_t layer,
                                uint64_t positions, uint64_t counts, int64_t capacity,
                                uint64_t keys, uint64_t values, int32_t dtype, int64_t tokens,
                                int32_t heads, int32_t head_dim, int64_t token_stride,
                                int64_t head_stride);
%ignore pq_decode_select_device_batch;
%ignore pq_fetch_kv_device_batch;
%exception pq_py_decode_select_device_batch %{ $action %}
%exception pq_py_fetch_kv_device_batch %{ $action %}
%rename(pq_decode_select_device_batch) pq_py_decode_select_device_batch;
%rename(pq_fetch_kv_device_batch) pq_py_fetch_kv_device_batch;
PyObject* pq_py_decode_select_device_batch(pq_context* ctx, int32_t layer, PyObject* items);
PyObject* pq_py_fetch_kv_device_batch(pq_context* ctx, int32_t layer, PyObject* items);
%exception pq_py_decode_select_batch %{ $action %}
%exception pq_py_fetch_kv_batch %{ $action %}
%rename(pq_decode_select_batch) pq_py_decode_select_batch;
%rename(pq_fetch_kv_batch) pq_py_fetch_kv_batch;
PyObject* pq_py_decode_select_batch(pq_context* ctx, int32_t layer, PyObject* seq_ids,
                                    PyObject* queries, PyObject* outs);
PyObject* pq_py_fetch_kv_batch(pq_context* ctx, int32_t layer, PyObject* seq_ids,
                               PyObject* selections, PyObject* out_keys, PyObject* out_values);

/* The index-only tier (0.10): the paged calls and the multi-token select take
 * the pool and its map as arrays (see pq_py_paged_from above) and run
 * without the GIL; pq_paged_keys itself is not wrapped. */
%ignore pq_paged_keys;
%ignore pq_prefill_layer_paged;
%ignore pq_decode_append_paged;
%ignore pq_decode_select_multi;
%exception pq_py_prefill_layer_paged %{ $action %}
%exception pq_py_decode_append_paged %{ $action %}
%exception pq_py_decode_select_multi %{ $action %}
%rename(pq_prefill_layer_paged) pq_py_prefill_layer_paged;
%rename(pq_decode_append_paged) pq_py_decode_append_paged;
%rename(pq_decode_select_multi) pq_py_decode_select_multi;
PyObject* pq_py_prefill_layer_paged(pq_context* ctx, uint64_t seq_id, int32_t layer,
                                    PyObject* pool, PyObject* slots, PyObject* block_table,
                                    int32_t block_size, int64_t tokens);
PyObject* pq_py_decode_append_paged(pq_context* ctx, uint64_t seq_id, int32_t layer,
                                    PyObject* pool, PyObject* slots, PyObject* block_table,
                                    int32_t block_size, int64_t tokens);
PyObject* pq_py_decode_select_multi(pq_context* ctx, uint64_t seq_id, int32_t layer,
                                    PyObject* queries, int32_t rows, PyObject* out,
                                    PyObject* pool, PyObject* slots, PyObject* block_table,
                                    int32_t block_size);

/* pq_observe_attention: one float32 per selection entry, [kv_heads][capacity]. */
%typemap(in) const float* probs (Py_buffer view = {0}) {
  if (pq_py_dense($input, "probs", 0, 'f', -1, &view) != 0) SWIG_fail;
  $1 = (float*)view.buf;
}
%typemap(check) const float* probs {
  /* arg4 is the selection, already checked against the context's kv heads. */
  const pq_py_selection* selection = (const pq_py_selection*)arg4;
  if (view$argnum.len != selection->positions.len) {
    PyErr_Format(PyExc_ValueError,
                 "probs: %zd float32 values for a selection of %zd kv heads x capacity %zd; "
                 "expected one per position", view$argnum.len / 4,
                 selection->positions.shape[0], selection->positions.shape[1]);
    SWIG_fail;
  }
}
%typemap(freearg) const float* probs {
  PyBuffer_Release(&view$argnum);
}

/* pq_sequence_token_classes: the classes from one contiguous buffer of
 * uint8 (numpy uint8, bytes, bytearray), which also gives their count. */
%typemap(in) (int64_t count, const uint8_t* classes) (Py_buffer view = {0}) {
  if (pq_py_get_buffer($input, "classes", 0, &view) != 0) SWIG_fail;
  if (view.itemsize != 1 || !PyBuffer_IsContiguous(&view, 'C')) {
    PyErr_Format(PyExc_TypeError, "classes: expected contiguous uint8 values, got format '%s'",
                 view.format ? view.format : "B");
    PyBuffer_Release(&view);
    SWIG_fail;
  }
  $1 = (int64_t)view.len;
  $2 = ($2_ltype)view.buf;
}
%typemap(freearg) (int64_t count, const uint8_t* classes) {
  PyBuffer_Release(&view$argnum);
}

/* --- pq_decode_attend: out [q_heads][head_dim], out_lse [q_heads] or None -- */
/* The sizes are checked here rather than in a check typemap, which would
 * also apply to pq_index_centroids' float* out (its in typemap is the
 * multi-argument one below); arg1, the context, is converted already. */
%typemap(in) float* out (Py_buffer view = {0}) {
  if (pq_py_dense($input, "out", 1, 'f', -1, &view) != 0 ||
      pq_py_check_attend_output(arg1, &view, "out", 1) != 0)
    SWIG_fail;
  $1 = (float*)view.buf;
}
%typemap(in) float* out_lse (Py_buffer view = {0}) {
  $1 = NULL;
  if ($input != Py_None) {
    if (pq_py_dense($input, "out_lse", 1, 'f', -1, &view) != 0 ||
        pq_py_check_attend_output(arg1, &view, "out_lse", 0) != 0)
      SWIG_fail;
    $1 = (float*)view.buf;
  }
}
%typemap(freearg) float* out, float* out_lse {
  PyBuffer_Release(&view$argnum);
}

/* --- index introspection --------------------------------------------------- */
%typemap(in) uint8_t* out (Py_buffer view = {0}) {
  if (pq_py_get_buffer($input, "out", 1, &view) != 0) SWIG_fail;
  if (!PyBuffer_IsContiguous(&view, 'C')) {
    PyErr_SetString(PyExc_ValueError, "out: must be C-contiguous");
    SWIG_fail;
  }
  $1 = (uint8_t*)view.buf;
}
%typemap(check) uint8_t* out {
  /* pq_index_codes(ctx = arg1, ..., count = arg6, out) */
  if (pq_py_check_codes_size(arg1, arg6, &view$argnum) != 0) SWIG_fail;
}
%typemap(freearg) uint8_t* out {
  PyBuffer_Release(&view$argnum);
}
/* pq_index_centroids: the buffer gives both the pointer and its size. */
%typemap(in) (float* out, int64_t out_floats) (Py_buffer view = {0}) {
  if (pq_py_dense($input, "out", 1, 'f', -1, &view) != 0) SWIG_fail;
  $1 = (float*)view.buf;
  $2 = (int64_t)(view.len / 4);
}
%typemap(freearg) (float* out, int64_t out_floats) {
  PyBuffer_Release(&view$argnum);
}

/* --- sequence state (0.5) --------------------------------------------------- */
/* pq_sequence_save_bytes(ctx, seq_id) returns the state as bytes (see
 * pq_py_sequence_save_bytes above). pq_sequence_save_buffer(ctx, seq_id,
 * buffer) fills a writable buffer and returns the bytes written (a buffer
 * too small raises PQError PQ_ERR_BUFFER_TOO_SMALL; pq_sequence_state_size
 * gives the size). pq_sequence_restore(ctx, seq_id, data) reads any
 * C-contiguous buffer (bytes, bytearray, memoryview, numpy). Paths are str,
 * bytes or os.PathLike (PyUnicode_FSConverter, which refuses a NUL byte).
 * pq_sequence_save's pq_write_fn callback is not wrapped. */
%ignore pq_sequence_save;
%exception pq_py_sequence_save_bytes %{ $action %}
%rename(pq_sequence_save_bytes) pq_py_sequence_save_bytes;
PyObject* pq_py_sequence_save_bytes(pq_context* ctx, uint64_t seq_id);

%typemap(in) (void* buffer, uint64_t capacity) (Py_buffer view = {0}) {
  if (pq_py_get_buffer($input, "buffer", 1, &view) != 0) SWIG_fail;
  if (!PyBuffer_IsContiguous(&view, 'C')) {
    PyErr_SetString(PyExc_ValueError, "buffer: must be C-contiguous");
    SWIG_fail;
  }
  $1 = view.buf;
  $2 = (uint64_t)view.len;
}
%typemap(freearg) (void* buffer, uint64_t capacity) {
  PyBuffer_Release(&view$argnum);
}
%typemap(in) (const void* data, uint64_t size) (Py_buffer view = {0}) {
  if (pq_py_get_buffer($input, "data", 0, &view) != 0) SWIG_fail;
  if (!PyBuffer_IsContiguous(&view, 'C')) {
    PyErr_SetString(PyExc_ValueError, "data: must be C-contiguous; use bytes(data)");
    SWIG_fail;
  }
  /* An empty buffer may have no address: the library then sees an empty
   * state (corrupt), not a NULL argument. */
  $1 = ($1_ltype)(view.buf != NULL ? view.buf : (void*)"");
  $2 = (uint64_t)view.len;
}
%typemap(freearg) (const void* data, uint64_t size) {
  PyBuffer_Release(&view$argnum);
}
/* pq_sequence_restore_begin / _kv(ctx, seq_id, data) read any C-contiguous
 * buffer and return the bytes read; too few bytes raise PQError
 * PQ_ERR_BUFFER_TOO_SMALL with .needed (pq_py_restore_step above). */
%ignore pq_sequence_restore_begin;
%ignore pq_sequence_restore_kv;
%exception pq_py_sequence_restore_begin %{ $action %}
%exception pq_py_sequence_restore_kv %{ $action %}
%rename(pq_sequence_restore_begin) pq_py_sequence_restore_begin;
%rename(pq_sequence_restore_kv) pq_py_sequence_restore_kv;
PyObject* pq_py_sequence_restore_begin(pq_context* ctx, uint64_t seq_id, const void* data,
                                       uint64_t size);
PyObject* pq_py_sequence_restore_kv(pq_context* ctx, uint64_t seq_id, const void* data,
                                    uint64_t size);
%typemap(in, numinputs=0) uint64_t* out_bytes (uint64_t value = 0),
                          uint64_t* out_written (uint64_t value = 0) {
  $1 = &value;
}
%typemap(argout) uint64_t* out_bytes, uint64_t* out_written {
  $result = SWIG_Python_AppendOutput($result,
                                     PyLong_FromUnsignedLongLong((unsigned long long)*$1));
}
%typemap(in) const char* path (PyObject* encoded = NULL) {
  if (!PyUnicode_FSConverter($input, &encoded)) SWIG_fail;
  $1 = PyBytes_AS_STRING(encoded);
}
%typemap(freearg) const char* path {
  Py_XDECREF(encoded$argnum);
}

/* --- out-parameters become return values ---------------------------------- */
%typemap(in, numinputs=0) int64_t* out_tokens (int64_t value = 0),
                          int64_t* out_rows (int64_t value = 0),
                          int64_t* out_capacity (int64_t value = 0),
                          int64_t* out_count (int64_t value = 0) {
  $1 = &value;
}
%typemap(argout) int64_t* out_tokens, int64_t* out_rows, int64_t* out_capacity,
                  int64_t* out_count {
  $result = SWIG_Python_AppendOutput($result, PyLong_FromLongLong((long long)*$1));
}
%typemap(in, numinputs=0) int32_t* out_backend (int32_t value = 0) {
  $1 = &value;
}
%typemap(argout) int32_t* out_backend {
  $result = SWIG_Python_AppendOutput($result, PyLong_FromLong((long)*$1));
}

%typemap(in, numinputs=0) pq_context** out (pq_context* created = NULL),
                          pq_pool** out (pq_pool* created = NULL) {
  $1 = &created;
}
%typemap(argout) pq_context** out, pq_pool** out {
  $result = SWIG_Python_AppendOutput($result, SWIG_NewPointerObj(*$1, $*1_descriptor, 0));
}
%typemap(in, numinputs=0) int32_t* out_threads (int32_t value = 0) {
  $1 = &value;
}
%typemap(argout) int32_t* out_threads {
  $result = SWIG_Python_AppendOutput($result, PyLong_FromLong((long)*$1));
}

/* Structs the library fills: struct_size is set here, where sizeof is known,
 * and the result is a new object the caller owns. */
%typemap(in, numinputs=0) pq_layer_info* out ($*1_ltype filled),
                          pq_stats* out ($*1_ltype filled) {
  memset(&filled, 0, sizeof filled);
  filled.struct_size = (uint32_t)sizeof filled;
  $1 = &filled;
}
%typemap(in, numinputs=0) pq_config* out (pq_config config) {
  pq_config_default(&config);
  $1 = &config;
}
%typemap(argout) pq_layer_info* out, pq_stats* out {
  $*1_ltype* copy = ($*1_ltype*)malloc(sizeof *copy);
  if (copy == NULL) {
    PyErr_NoMemory();
    SWIG_fail;
  }
  *copy = *$1;
  $result = SWIG_Python_AppendOutput($result,
                                     SWIG_NewPointerObj(copy, $1_descriptor, SWIG_POINTER_OWN));
}
/* The effective configuration's paths are the pointers the caller gave
 * pq_create, maybe freed since: the copy does not carry them (the library
 * reports kv_disk_path NULL anyway). */
%typemap(argout) pq_config* out {
  pq_config* copy = (pq_config*)malloc(sizeof *copy);
  if (copy == NULL) {
    PyErr_NoMemory();
    SWIG_fail;
  }
  *copy = *$1;
  copy->cuda_plugin_path = NULL;
  copy->kv_disk_path = NULL;
  copy->kv_scales = NULL; /* the context's own copy: not this struct's to free */
  $result = SWIG_Python_AppendOutput($result,
                                     SWIG_NewPointerObj(copy, $1_descriptor, SWIG_POINTER_OWN));
}

/* --- pq_config ------------------------------------------------------------- */
/* A new pq_config starts from the library's defaults (so pq_config_default,
 * which would also drop the struct's path copies, is not wrapped).
 * cuda_plugin_path and kv_disk_path are copies owned by the struct; the
 * library reads them during pq_create only. */
%ignore pq_config_default;
/* The fp8 scales (0.10) likewise: a copy owned by the struct, set from the
 * bytes of float32 values (Context takes a sequence of floats). */
%ignore pq_config::kv_scales;
%typemap(in) (const char* scale_bytes, size_t scale_size) (Py_buffer view = {0}) {
  if (PyObject_GetBuffer($input, &view, PyBUF_SIMPLE) != 0) SWIG_fail;
  $1 = (const char*)view.buf;
  $2 = (size_t)view.len;
}
%typemap(freearg) (const char* scale_bytes, size_t scale_size) {
  if (view$argnum.obj != NULL) PyBuffer_Release(&view$argnum);
}
%extend pq_config {
  pq_config() {
    pq_config* config = (pq_config*)calloc(1, sizeof *config);
    if (config != NULL) pq_config_default(config);
    return config;
  }
  ~pq_config() {
    free((char*)$self->cuda_plugin_path);
    free((char*)$self->kv_disk_path);
    free((float*)$self->kv_scales);
    free($self);
  }
  void set_kv_scales(const char* scale_bytes, size_t scale_size) {
    float* copy = NULL;
    if (scale_size > 0) {
      copy = (float*)malloc(scale_size);
      if (copy != NULL) memcpy(copy, scale_bytes, scale_size);
    }
    free((float*)$self->kv_scales);
    $self->kv_scales = copy;
  }
}
/* Set from str, bytes or os.PathLike (os.fsencode's bytes), or None for
 * NULL; a NUL byte raises ValueError, as os functions do, instead of
 * reaching the library as a shorter path. */
%typemap(in) const char* cuda_plugin_path (PyObject* encoded = NULL),
             const char* kv_disk_path (PyObject* encoded = NULL) {
  if ($input == Py_None) {
    $1 = NULL;
  } else {
    if (!PyUnicode_FSConverter($input, &encoded)) SWIG_fail;
    $1 = PyBytes_AS_STRING(encoded);
  }
}
%typemap(freearg) const char* cuda_plugin_path, const char* kv_disk_path {
  Py_XDECREF(encoded$argnum);
}
%typemap(memberin) const char* cuda_plugin_path, const char* kv_disk_path {
  free((char*)$1);
  $1 = NULL;
  if ($input != NULL) {
    size_t size = strlen($input) + 1;
    char* copy = (char*)malloc(size);
    if (copy != NULL) $1 = (const char*)memcpy(copy, $input, size);
  }
}

/* --- CUDA streams ---------------------------------------------------------- */
/* A cudaStream_t as an integer (torch.cuda.Stream.cuda_stream, cupy's .ptr)
 * or None for the context's own stream. */
%typemap(in) void* cuda_stream {
  if ($input == Py_None) {
    $1 = NULL;
  } else {
    $1 = PyLong_AsVoidPtr($input);
    if ($1 == NULL && PyErr_Occurred()) SWIG_fail;
  }
}

/* --- hooks: after the typemaps above, which their out-parameters use --------- */
%exception pq_py_hooks_new %{ $action %}
%exception pq_py_hooks_free %{ $action %}
%inline %{
/* Hooks for pq_py_create_with_hooks: log (None or callable(level, message)) at
 * log_level, build_done (None or callable(seq_id, layer, status)),
 * build_progress (None or callable(seq_id, layer, stage, done, total,
 * fraction)) and pool (None or a pq_pool). Holds references to the callables until
 * pq_py_hooks_free, which the caller runs after pq_destroy (which waits for
 * the builds, and so for their hooks). NULL with MemoryError. */
pq_py_hooks* pq_py_hooks_new(PyObject* log, int32_t log_level, PyObject* build_done,
                             PyObject* build_progress, pq_pool* pool) {
  pq_py_hooks* h = (pq_py_hooks*)calloc(1, sizeof *h);
  if (h == NULL) {
    PyErr_NoMemory();
    return NULL;
  }
  pq_hooks_default(&h->hooks);
  h->hooks.log_level = log_level;
  h->hooks.pool = pool;
  if (log != NULL && log != Py_None) {
    Py_INCREF(log);
    h->log = log;
    h->hooks.log = pq_py_log_hook;
    h->hooks.log_user = h;
  }
  if (build_done != NULL && build_done != Py_None) {
    Py_INCREF(build_done);
    h->build_done = build_done;
    h->hooks.build_done = pq_py_build_done_hook;
    h->hooks.build_done_user = h;
  }
  if (build_progress != NULL && build_progress != Py_None) {
    Py_INCREF(build_progress);
    h->build_progress = build_progress;
    h->hooks.build_progress = pq_py_build_progress_hook;
    h->hooks.build_progress_user = h;
  }
  return h;
}

void pq_py_hooks_free(pq_py_hooks* hooks) {
  if (hooks == NULL) return;
  Py_XDECREF(hooks->log);
  Py_XDECREF(hooks->build_done);
  Py_XDECREF(hooks->build_progress);
  free(hooks);
}

/* pq_create_with_hooks with hooks from pq_py_hooks_new (None: no hooks). */
pq_status pq_py_create_with_hooks(const pq_config* config, const pq_py_hooks* hooks,
                                  pq_context** out) {
  return pq_create_with_hooks(config, hooks ? &hooks->hooks : NULL, out);
}
%}

