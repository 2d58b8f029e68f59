// The logits of the AVX-512 attend (attention_avx512.cpp) on AMX-BF16
// tiles: bf16 keys against the group's queries as bf16 (exact, as for
// VDPBF16PS), one TDPBF16PS per 16 rows and 32 elements. Tiles read memory
// at a fixed stride and the selected rows are scattered, so each block's
// keys are first copied into a dense buffer in L1.
//
// Not chosen by attend_rows: on the Intel Xeon it was written on, the
// attend with these logits measured 1.13-1.38x slower than with VDPBF16PS
// (in cache and at 32K and 128K tokens; docs/perf.md, "AMX-BF16 and
// AVX512_FP16 in the attend"): a group of 4 fills 4 of a tile's 16
// columns, and the copy and the logits' way out through memory cost more
// than the dot products saved. Kept for bench_attend_kernels, which
// measures it (attend_rows_avx512_with, AttendLogits::kAmxBf16), and
// tested against the reference by the kernel tests.
//
// Usage, on one thread: amx_logits_begin once per attend call (loads the
// tile configuration and the queries' tiles), amx_logits_block per block
// of rows, amx_logits_end (releases the tiles, so that context switches do
// not save 8 KiB of tile data).
#pragma once

#include <cstdint>

#include "backend/attention.h"

namespace pq {

// Whether the AMX logits apply: a group of 1 to 8 query heads and a
// head_dim that is a multiple of 32 and at most 128 (every chunk of the
// queries in a tile register of its own).
bool amx_logits_shape_ok(int32_t group, int32_t head_dim);

// What the AMX logits keep between the calls of one attend.
struct alignas(64) AmxLogitsScratch {
  uint8_t tile_config[64];
  uint16_t queries[4][16 * 16];              // chunk c: 16 pairs x group columns (VNNI)
  uint16_t keys[kAttentionBlockRows * 128];  // the block's rows, dense
  float logits[kAttentionBlockRows * 8];     // [row][group]
};

// qb: the group's queries as bf16, [group][head_dim].
void amx_logits_begin(const uint16_t* qb, int32_t group, int32_t head_dim, AmxLogitsScratch& s);
// logits[g * kAttentionBlockRows + i] = scale * q_g . keys[i], i < rows
// (lanes from rows to the block's end get finite values of no meaning).
// Copying a block ahead (the tiles' loads then never follow the stores of
// their rows) measured slower: 1.35x against 1.13-1.18x the VDPBF16PS
// attend in cache.
void amx_logits_block(const uint8_t* const* keys, int64_t rows, int32_t group, int32_t head_dim,
                      float scale, float* logits, AmxLogitsScratch& s);
void amx_logits_end();

}  // namespace pq
