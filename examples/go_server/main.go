// go_server: libpqcache in the shape of an inference server's decode loop,
// in Go, replaying a real attention trace (.pqtrace).
//
// The server does not link libpqcache: it loads it at run time with dlopen
// (from -lib, else $PQCACHE_LIB, else the soname libpqcache.so.0 through the
// loader's search path), as a server would that runs with or without the
// library installed, and says so clearly when it is missing.
//
// For the trace's prompt it prefills every traced layer; then, for each
// decode step (position p = q_first, q_first+1, ...) and layer, it appends
// token p's key and value, selects the positions to attend to for token p's
// query, and fetches their rows, as the attention kernel would. A second
// context with the EXACT selector (the oracle: exact q.k over every key)
// runs alongside, so each step prints how many of the oracle's top-k middle
// tokens PQ found (recall). Fetched rows are compared with the trace.
//
// Usage: go_server [-lib PATH] [-trace FILE] [-steps N] [-topk-fraction F]
//
//	[-min-recall R]
//
// Exit status: 0 on success, 1 on a library error or a check that failed,
// 2 when the library cannot be loaded.
package main

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>
#include "pqcache.h"

// The functions the server calls, each through a pointer that dlsym fills.
// __typeof__ takes each pointer's type from the declaration in pqcache.h
// without referring to the symbol, so nothing here links against it.
#define PQ_FUNCTIONS(X)                                                        \
  X(pq_version_string) X(pq_status_string) X(pq_last_error)                   \
  X(pq_config_default) X(pq_create) X(pq_destroy) X(pq_sequence_add)          \
  X(pq_tensor_init) X(pq_prefill_layer) X(pq_decode_append)                   \
  X(pq_selection_capacity) X(pq_decode_select) X(pq_fetch_kv)                 \
  X(pq_wait_builds) X(pq_stats_get)

typedef struct pq_api {
#define PQ_FIELD(name) __typeof__(&name) name;
  PQ_FUNCTIONS(PQ_FIELD)
#undef PQ_FIELD
} pq_api;

static pq_api api;

// NULL on success, else dlerror()'s message.
static const char* api_load(const char* path) {
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) return dlerror();
#define PQ_LOAD(name) \
  if ((*(void**)&api.name = dlsym(lib, #name)) == NULL) return dlerror();
  PQ_FUNCTIONS(PQ_LOAD)
#undef PQ_LOAD
  return NULL;
}

// cgo cannot call through a C function pointer: these trampolines do. The
// ones that take Go buffers build the pq_tensor / pq_selection descriptors
// here, on the C stack, because cgo forbids Go memory that holds Go
// pointers from being passed to C.
static const char* call_version_string(void) { return api.pq_version_string(); }
static const char* call_status_string(int32_t s) { return api.pq_status_string(s); }
static const char* call_last_error(void) { return api.pq_last_error(); }
static void call_config_default(pq_config* c) { api.pq_config_default(c); }
static pq_status call_create(const pq_config* c, pq_context** out) { return api.pq_create(c, out); }
static void call_destroy(pq_context* ctx) { api.pq_destroy(ctx); }
static pq_status call_sequence_add(pq_context* ctx, uint64_t seq) {
  return api.pq_sequence_add(ctx, seq);
}
static pq_status call_wait_builds(pq_context* ctx) { return api.pq_wait_builds(ctx); }
static pq_status call_stats_get(pq_context* ctx, pq_stats* out) {
  out->struct_size = sizeof *out;
  return api.pq_stats_get(ctx, out);
}
static pq_status call_selection_capacity(pq_context* ctx, uint64_t seq, int32_t layer,
                                         int64_t* out) {
  return api.pq_selection_capacity(ctx, seq, layer, out);
}

// Prefill (append = 0) or decode append (append = 1) of `tokens` dense
// token-major rows of keys and values.
static pq_status call_store(pq_context* ctx, uint64_t seq, int32_t layer, int append,
                            void* keys, void* values, int32_t dtype, int64_t tokens,
                            int32_t heads, int32_t head_dim) {
  pq_tensor k, v;
  pq_status s = api.pq_tensor_init(&k, keys, dtype, PQ_LAYOUT_TOKEN_MAJOR, tokens, heads, head_dim);
  if (s == PQ_OK)
    s = api.pq_tensor_init(&v, values, dtype, PQ_LAYOUT_TOKEN_MAJOR, tokens, heads, head_dim);
  if (s != PQ_OK) return s;
  return append ? api.pq_decode_append(ctx, seq, layer, &k, &v)
                : api.pq_prefill_layer(ctx, seq, layer, &k, &v);
}

static pq_status call_select(pq_context* ctx, uint64_t seq, int32_t layer, void* query,
                             int32_t dtype, int32_t q_heads, int32_t head_dim,
                             int32_t* positions, int32_t* counts, int64_t capacity) {
  pq_tensor q;
  pq_selection sel;
  pq_status s = api.pq_tensor_init(&q, query, dtype, PQ_LAYOUT_TOKEN_MAJOR, 1, q_heads, head_dim);
  if (s != PQ_OK) return s;
  sel.positions = positions;
  sel.counts = counts;
  sel.capacity = capacity;
  return api.pq_decode_select(ctx, seq, layer, &q, &sel);
}

// Fetch into head-major [kv_heads][capacity][head_dim] buffers.
static pq_status call_fetch(pq_context* ctx, uint64_t seq, int32_t layer, int32_t* positions,
                            int32_t* counts, int64_t capacity, void* keys, void* values,
                            int32_t dtype, int32_t kv_heads, int32_t head_dim) {
  pq_tensor k, v;
  pq_selection sel;
  pq_status s = api.pq_tensor_init(&k, keys, dtype, PQ_LAYOUT_HEAD_MAJOR, capacity, kv_heads,
                                   head_dim);
  if (s == PQ_OK)
    s = api.pq_tensor_init(&v, values, dtype, PQ_LAYOUT_HEAD_MAJOR, capacity, kv_heads, head_dim);
  if (s != PQ_OK) return s;
  sel.positions = positions;
  sel.counts = counts;
  sel.capacity = capacity;
  return api.pq_fetch_kv(ctx, seq, layer, &sel, &k, &v);
}
*/
import "C"

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"runtime"
	"time"
	"unsafe"
)

const sequence = 1 // the one request this replay serves

func main() {
	// pq_last_error is thread-local: keeping the decode loop's goroutine on
	// one OS thread makes it describe the call just made.
	runtime.LockOSThread()

	defaultLib := os.Getenv("PQCACHE_LIB")
	if defaultLib == "" {
		defaultLib = "libpqcache.so.0"
	}
	libPath := flag.String("lib", defaultLib, "libpqcache to load (default: $PQCACHE_LIB, else the soname through the loader's search path)")
	tracePath := flag.String("trace", "tests/data/smollm2_sotu_2k.pqtrace", "the .pqtrace to replay")
	steps := flag.Int("steps", 32, "decode steps (each one token, all traced layers)")
	topkFraction := flag.Float64("topk-fraction", 0.2, "top-k budget as a fraction of the middle tokens")
	minRecall := flag.Float64("min-recall", 0, "exit 1 if PQ's mean recall against the exact top-k is below this")
	flag.Parse()

	if err := loadLibrary(*libPath); err != nil {
		fmt.Fprintf(os.Stderr, "go_server: cannot load libpqcache from %q:\n  %v\n"+
			"  Build it (ninja -C build pqcache) and pass its path with -lib or $PQCACHE_LIB,\n"+
			"  or install it where the dynamic loader finds libpqcache.so.0.\n", *libPath, err)
		os.Exit(2)
	}
	if err := serve(*tracePath, *steps, float32(*topkFraction), *minRecall); err != nil {
		fmt.Fprintf(os.Stderr, "go_server: %v\n", err)
		os.Exit(1)
	}
}

func loadLibrary(path string) error {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	if msg := C.api_load(cpath); msg != nil {
		return fmt.Errorf("%s", C.GoString(msg))
	}
	return nil
}

// check turns a status into an error carrying the library's message.
func check(op string, s C.pq_status) error {
	if s == C.PQ_OK {
		return nil
	}
	return fmt.Errorf("%s failed: %s\n  %s", op, C.GoString(C.call_status_string(C.int32_t(s))),
		C.GoString(C.call_last_error()))
}

// cache is one pq_context serving the request.
type cache struct {
	name string
	ctx  *C.pq_context
}

func newCache(name string, t *Trace, selector C.int32_t, topkFraction float32) (*cache, error) {
	var cfg C.pq_config
	C.call_config_default(&cfg)
	cfg.num_layers = C.int32_t(t.ModelLayers)
	cfg.num_q_heads = C.int32_t(t.QHeads)
	cfg.num_kv_heads = C.int32_t(t.KVHeads)
	cfg.head_dim = C.int32_t(t.HeadDim)
	cfg.dtype = C.PQ_DTYPE_F32
	if t.DType == "f16" {
		cfg.dtype = C.PQ_DTYPE_F16
	}
	cfg.selector = selector
	cfg.topk_fraction = C.float(topkFraction)
	c := &cache{name: name}
	if err := check("pq_create ("+name+")", C.call_create(&cfg, &c.ctx)); err != nil {
		return nil, err
	}
	if err := check("pq_sequence_add", C.call_sequence_add(c.ctx, sequence)); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

func (c *cache) close() { C.call_destroy(c.ctx) }

func (c *cache) store(op string, t *Trace, layer int, appendTokens bool, keys, values []byte, tokens int) error {
	mode := C.int(0)
	if appendTokens {
		mode = 1
	}
	dtype := C.int32_t(C.PQ_DTYPE_F32)
	if t.DType == "f16" {
		dtype = C.PQ_DTYPE_F16
	}
	return check(op, C.call_store(c.ctx, sequence, C.int32_t(layer), mode,
		unsafe.Pointer(&keys[0]), unsafe.Pointer(&values[0]), dtype, C.int64_t(tokens),
		C.int32_t(t.KVHeads), C.int32_t(t.HeadDim)))
}

// selection: per kv head, row h of positions holds counts[h] positions.
type selection struct {
	capacity  int
	counts    []int32
	positions []int32
}

func (s *selection) head(h int) []int32 {
	return s.positions[h*s.capacity : h*s.capacity+int(s.counts[h])]
}

func (c *cache) selectTokens(t *Trace, layer int, query []byte) (*selection, error) {
	var capacity C.int64_t
	if err := check("pq_selection_capacity", C.call_selection_capacity(c.ctx, sequence, C.int32_t(layer), &capacity)); err != nil {
		return nil, err
	}
	s := &selection{capacity: int(capacity), counts: make([]int32, t.KVHeads),
		positions: make([]int32, t.KVHeads*int(capacity))}
	dtype := C.int32_t(C.PQ_DTYPE_F32)
	if t.DType == "f16" {
		dtype = C.PQ_DTYPE_F16
	}
	err := check("pq_decode_select ("+c.name+")", C.call_select(c.ctx, sequence, C.int32_t(layer),
		unsafe.Pointer(&query[0]), dtype, C.int32_t(t.QHeads), C.int32_t(t.HeadDim),
		(*C.int32_t)(&s.positions[0]), (*C.int32_t)(&s.counts[0]), capacity))
	return s, err
}

// fetch gathers the selected rows into head-major [kv_heads][capacity][head_dim]
// buffers, what an attention kernel reads.
func (c *cache) fetch(t *Trace, layer int, s *selection) (keys, values []byte, err error) {
	size := t.KVHeads * s.capacity * t.HeadDim * t.ElementSize()
	keys, values = make([]byte, size), make([]byte, size)
	dtype := C.int32_t(C.PQ_DTYPE_F32)
	if t.DType == "f16" {
		dtype = C.PQ_DTYPE_F16
	}
	err = check("pq_fetch_kv", C.call_fetch(c.ctx, sequence, C.int32_t(layer),
		(*C.int32_t)(&s.positions[0]), (*C.int32_t)(&s.counts[0]), C.int64_t(s.capacity),
		unsafe.Pointer(&keys[0]), unsafe.Pointer(&values[0]), dtype, C.int32_t(t.KVHeads), C.int32_t(t.HeadDim)))
	return keys, values, err
}

func (c *cache) stats() (C.pq_stats, error) {
	var s C.pq_stats
	err := check("pq_stats_get", C.call_stats_get(c.ctx, &s))
	return s, err
}

// middle keeps the positions in [sink, length-local): those chosen by score
// (sinks and the local window are selected by every selector).
func middle(positions []int32, sink, end int) map[int32]bool {
	m := make(map[int32]bool)
	for _, p := range positions {
		if int(p) >= sink && int(p) < end {
			m[p] = true
		}
	}
	return m
}

func serve(tracePath string, steps int, topkFraction float32, minRecall float64) error {
	t, err := ReadTrace(tracePath)
	if err != nil {
		return err
	}
	prompt := t.QFirst
	if steps < 1 {
		return fmt.Errorf("-steps %d: want at least 1", steps)
	}
	if steps > t.Tokens-prompt {
		steps = t.Tokens - prompt
	}
	fmt.Printf("libpqcache %s loaded at run time\n", C.GoString(C.call_version_string()))
	fmt.Printf("trace %s: %s over %s, %s, %d tokens, %d q heads / %d kv heads x %d, layers %v\n",
		tracePath, t.Model, t.Text, t.DType, t.Tokens, t.QHeads, t.KVHeads, t.HeadDim, t.Layers)

	pq, err := newCache("PQ", t, C.PQ_SELECTOR_PQ, topkFraction)
	if err != nil {
		return err
	}
	defer pq.close()
	exact, err := newCache("EXACT", t, C.PQ_SELECTOR_EXACT, topkFraction)
	if err != nil {
		return err
	}
	defer exact.close()

	// Prefill: the prompt's K/V of every traced layer; the PQ builds run on
	// the library's worker pool while the next layers are prefilled.
	start := time.Now()
	for i, layer := range t.Layers {
		for _, c := range []*cache{pq, exact} {
			if err := c.store("pq_prefill_layer", t, layer, false,
				t.KeyRows(i, 0, prompt), t.ValueRows(i, 0, prompt), prompt); err != nil {
				return err
			}
		}
	}
	if err := check("pq_wait_builds", C.call_wait_builds(pq.ctx)); err != nil {
		return err
	}
	fmt.Printf("prefill: %d tokens x %d layers, PQ indexes built in %.0f ms\n",
		prompt, len(t.Layers), time.Since(start).Seconds()*1e3)

	var cfg C.pq_config
	C.call_config_default(&cfg)
	sink, local := int(cfg.sink_tokens), int(cfg.local_tokens)

	var recallSum float64
	var recallCount, rowsChecked int
	for s := 0; s < steps; s++ {
		pos := prompt + s
		length := pos + 1
		line := fmt.Sprintf("step %3d pos %4d", s, pos)
		for i, layer := range t.Layers {
			k, v := t.KeyRows(i, pos, 1), t.ValueRows(i, pos, 1)
			var sel [2]*selection
			for j, c := range []*cache{pq, exact} {
				if err := c.store("pq_decode_append", t, layer, true, k, v, 1); err != nil {
					return err
				}
				if sel[j], err = c.selectTokens(t, layer, t.Query(i, pos)); err != nil {
					return err
				}
			}

			// What attention would read: the PQ selection's rows. They must be
			// the trace's rows at the selected positions.
			keys, values, err := pq.fetch(t, layer, sel[0])
			if err != nil {
				return err
			}
			rowBytes := t.HeadDim * t.ElementSize()
			for h := 0; h < t.KVHeads; h++ {
				for r, p := range sel[0].head(h) {
					at := (h*sel[0].capacity + r) * rowBytes
					want := int(p)*t.KVHeads*rowBytes + h*rowBytes
					if !bytes.Equal(keys[at:at+rowBytes], t.KeyRows(i, 0, length)[want:want+rowBytes]) ||
						!bytes.Equal(values[at:at+rowBytes], t.ValueRows(i, 0, length)[want:want+rowBytes]) {
						return fmt.Errorf("layer %d kv head %d: fetched row of position %d differs from the trace", layer, h, p)
					}
					rowsChecked++
				}
			}

			// Recall: the share of the oracle's middle tokens PQ also picked.
			found, wanted := 0, 0
			for h := 0; h < t.KVHeads; h++ {
				want := middle(sel[1].head(h), sink, length-local)
				for p := range middle(sel[0].head(h), sink, length-local) {
					if want[p] {
						found++
					}
				}
				wanted += len(want)
			}
			recall := 1.0
			if wanted > 0 {
				recall = float64(found) / float64(wanted)
			}
			recallSum += recall
			recallCount++
			line += fmt.Sprintf(" | layer %2d: %3d/head, recall %.3f", layer, sel[0].counts[0], recall)
		}
		fmt.Println(line)
	}

	for _, c := range []*cache{pq, exact} {
		st, err := c.stats()
		if err != nil {
			return err
		}
		fmt.Printf("%-5s: %d selects, %.3f ms each, %.1f MiB scored\n", c.name, uint64(st.select_calls),
			float64(st.select_seconds)*1e3/float64(st.select_calls), float64(st.bytes_scored)/(1<<20))
	}
	mean := recallSum / float64(recallCount)
	fmt.Printf("fetched rows checked against the trace: %d, all equal\n", rowsChecked)
	fmt.Printf("mean recall of PQ against the exact top-k (%d steps x %d layers): %.3f\n",
		steps, len(t.Layers), mean)
	if mean < minRecall {
		return fmt.Errorf("mean recall %.3f is below -min-recall %.3f", mean, minRecall)
	}
	return nil
}
