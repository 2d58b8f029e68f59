#include "backend/attention_amx.h"

#if defined(__x86_64__) && defined(__GNUC__)

#include "base/x86_intrinsics.h"

#include <cstring>

#define PQ_AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx2")))

namespace pq {

namespace {

constexpr int64_t kB = kAttentionBlockRows;
static_assert(kB == 32, "a block is two tiles of 16 rows");
// Tile registers (GCC's tile intrinsics paste their numbers into the
// assembly, so they are literals): 0 and 1 C (the logits of rows 0-15 and
// 16-31), 2-5 B (the queries, a chunk of 32 elements each), 6 and 7 A (the
// keys of rows 0-15 and 16-31).
constexpr int kTileB0 = 2;

// The 64-byte operand of LDTILECFG (palette 1).
struct TileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
static_assert(sizeof(TileConfig) == 64, "LDTILECFG reads 64 bytes");

// C += the keys' chunk (A) times the queries' chunk in tile B.
#define PQ_AMX_CHUNK(B, chunk)                                                 \
  do {                                                                         \
    _tile_loadd(6, keys + 32 * (chunk), stride_bytes);                         \
    _tile_dpbf16ps(0, 6, B);                                                   \
    if (second) {                                                              \
      _tile_loadd(7, keys + 16 * (stride_bytes / 2) + 32 * (chunk), stride_bytes); \
      _tile_dpbf16ps(1, 7, B);                                                 \
    }                                                                          \
  } while (0)

PQ_AMX_TARGET inline void dot_chunks(int chunks, const uint16_t* keys, int64_t stride_bytes,
                                     bool second) {
  PQ_AMX_CHUNK(2, 0);
  if (chunks > 1) PQ_AMX_CHUNK(3, 1);
  if (chunks > 2) PQ_AMX_CHUNK(4, 2);
  if (chunks > 3) PQ_AMX_CHUNK(5, 3);
}
#undef PQ_AMX_CHUNK

PQ_AMX_TARGET inline void load_query_tiles(int chunks, const AmxLogitsScratch& s,
                                           int64_t stride_bytes) {
  _tile_loadd(2, s.queries[0], stride_bytes);
  if (chunks > 1) _tile_loadd(3, s.queries[1], stride_bytes);
  if (chunks > 2) _tile_loadd(4, s.queries[2], stride_bytes);
  if (chunks > 3) _tile_loadd(5, s.queries[3], stride_bytes);
}

}  // namespace

bool amx_logits_shape_ok(int32_t group, int32_t head_dim) {
  return group >= 1 && group <= 8 && head_dim % 32 == 0 && head_dim >= 32 && head_dim <= 128;
}

PQ_AMX_TARGET void amx_logits_begin(const uint16_t* qb, int32_t group, int32_t d,
                                    AmxLogitsScratch& s) {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  const auto columns = static_cast<uint16_t>(4 * group);  // group floats or bf16 pairs a row
  for (int t : {0, 1}) cfg.rows[t] = 16, cfg.colsb[t] = columns;
  for (int c = 0; c < d / 32; ++c) cfg.rows[kTileB0 + c] = 16, cfg.colsb[kTileB0 + c] = columns;
  for (int t : {6, 7}) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  std::memcpy(s.tile_config, &cfg, sizeof cfg);
  // B in the pair-interleaved (VNNI) layout: row j of chunk c holds, for
  // each query head n, its elements 32c + 2j and 32c + 2j + 1.
  for (int c = 0; c < d / 32; ++c)
    for (int j = 0; j < 16; ++j)
      for (int n = 0; n < group; ++n)
        for (int p = 0; p < 2; ++p)
          s.queries[c][j * 2 * group + 2 * n + p] = qb[n * d + 32 * c + 2 * j + p];
  std::memset(s.logits, 0, sizeof s.logits);
  std::memset(s.keys, 0, sizeof s.keys);  // rows past a short block read as zeros
  _tile_loadconfig(s.tile_config);
  load_query_tiles(d / 32, s, columns);
}

PQ_AMX_TARGET void amx_logits_block(const uint8_t* const* keys, int64_t rows, int32_t group,
                                    int32_t d, float scale, float* logits, AmxLogitsScratch& s) {
  const int64_t row_bytes = int64_t{2} * d;  // a multiple of 64
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t b = 0; b < row_bytes; b += 64)
      _mm512_store_si512(reinterpret_cast<uint8_t*>(s.keys) + i * row_bytes + b,
                         _mm512_loadu_si512(keys[i] + b));
  const bool second = rows > 16;
  _tile_zero(0);
  if (second) _tile_zero(1);
  dot_chunks(d / 32, s.keys, row_bytes, second);
  _tile_stored(0, s.logits, 4 * group);
  if (second) _tile_stored(1, s.logits + 16 * group, 4 * group);
  // [row][group] -> [group][row], scaled: a gather at stride group.
  const __m512i rows16 = _mm512_mullo_epi32(
      _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(group));
  const __m512 sc = _mm512_set1_ps(scale);
  for (int32_t g = 0; g < group; ++g) {
    const __m512i at = _mm512_add_epi32(rows16, _mm512_set1_epi32(g));
    _mm512_store_ps(logits + g * kB, _mm512_mul_ps(sc, _mm512_i32gather_ps(at, s.logits, 4)));
    _mm512_store_ps(logits + g * kB + 16,
                    _mm512_mul_ps(sc, _mm512_i32gather_ps(at, s.logits + 16 * group, 4)));
  }
}

PQ_AMX_TARGET void amx_logits_end() { _tile_release(); }

}  // namespace pq

#else

namespace pq {
bool amx_logits_shape_ok(int32_t, int32_t) { return false; }
void amx_logits_begin(const uint16_t*, int32_t, int32_t, AmxLogitsScratch&) {}
void amx_logits_block(const uint8_t* const*, int64_t, int32_t, int32_t, float, float*,
                      AmxLogitsScratch&) {}
void amx_logits_end() {}
}  // namespace pq

#endif
