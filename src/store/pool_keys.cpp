// The caller's paged key pool (pool_keys.h).
#include "store/pool_keys.h"

#include <cstring>
#include <string>

#include "base/dtype.h"
#include "base/error.h"
#include "base/tensor.h"

namespace pq {

PoolKeys::PoolKeys(const pq_paged_keys& keys, const pq_config& c, const char* what)
    : keys_(keys), what_(what), element_size_(dtype_size(c.dtype)) {
  const std::string pool_name = std::string(what) + "->pool";
  validate_tensor(&keys_.pool, {pool_name.c_str(), c.num_kv_heads, c.head_dim, c.dtype, 0, -1});
  if (keys_.pool.memory != PQ_MEMORY_HOST)
    fail(PQ_ERR_UNSUPPORTED, pool_name +
                                 ".memory is PQ_MEMORY_DEVICE; the library reads a paged pool "
                                 "in host memory in this version (give the keys as a device "
                                 "tensor to pq_prefill_layer / pq_decode_append instead)");
  if (keys_.slots != nullptr && keys_.block_table != nullptr)
    invalid(std::string(what) + " sets both slots and block_table; give one map (or neither: "
                                "position p is pool row p)");
  if (keys_.map_length < 0)
    invalid(std::string(what) + "->map_length is " + str(keys_.map_length) + "; expected >= 0");
  if (keys_.block_table != nullptr) {
    if (keys_.block_size < 1)
      invalid(std::string(what) + "->block_size is " + str(keys_.block_size) +
              "; expected >= 1 with a block_table");
    blocks_in_pool_ = keys_.pool.tokens / keys_.block_size;
  }
}

int64_t PoolKeys::slot(int64_t p) const {
  int64_t s = p;
  if (keys_.slots != nullptr) {
    if (p >= keys_.map_length)
      invalid(std::string(what_) + "->slots has " + str(keys_.map_length) +
              " entries; position " + str(p) + " is not mapped");
    s = keys_.slots[p];
  } else if (keys_.block_table != nullptr) {
    const int64_t entry = p / keys_.block_size;
    if (entry >= keys_.map_length)
      invalid(std::string(what_) + "->block_table has " + str(keys_.map_length) +
              " entries of " + str(keys_.block_size) + " tokens; position " + str(p) +
              " is not mapped");
    const int64_t block = keys_.block_table[entry];
    if (block < 0 || block >= blocks_in_pool_)
      invalid(std::string(what_) + "->block_table[" + str(entry) + "] is " + str(block) +
              "; the pool (" + str(keys_.pool.tokens) + " slots) holds blocks 0.." +
              str(blocks_in_pool_ - 1));
    return block * keys_.block_size + p % keys_.block_size;
  }
  if (s < 0 || s >= keys_.pool.tokens)
    invalid(std::string(what_) + (keys_.slots != nullptr ? "->slots[" + str(p) + "] is "
                                                         : " maps position " + str(p) + " to ") +
            str(s) + "; the pool holds slots 0.." + str(keys_.pool.tokens - 1));
  return s;
}

const uint8_t* PoolKeys::row(int64_t p, int32_t h) const {
  return tensor_row(keys_.pool, slot(p), h, element_size_);
}

pq_tensor PoolKeys::gather(int64_t first, int64_t count, std::vector<uint8_t>& buffer) const {
  const int32_t heads = keys_.pool.heads, dim = keys_.pool.head_dim;
  const size_t row_bytes = static_cast<size_t>(dim) * element_size_;
  std::vector<int64_t> slots(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) slots[i] = slot(first + i);  // all checked first
  buffer.resize(static_cast<size_t>(count) * heads * row_bytes);
  for (int64_t i = 0; i < count; ++i)
    for (int32_t h = 0; h < heads; ++h)
      std::memcpy(buffer.data() + (static_cast<size_t>(i) * heads + h) * row_bytes,
                  tensor_row(keys_.pool, slots[i], h, element_size_), row_bytes);
  pq_tensor t{};
  pq_tensor_init(&t, buffer.data(), keys_.pool.dtype, PQ_LAYOUT_TOKEN_MAJOR, count, heads, dim);
  return t;
}

namespace {

[[noreturn]] void not_read(const char* what) {
  fail(PQ_ERR_INTERNAL, std::string("the caller's pool is read for exact keys only; ") + what +
                            " was asked of it");
}

// The pool as a read-only tier for one call (pool_key_reader).
class PoolKeyReader final : public KvTier {
 public:
  PoolKeyReader(const PoolKeys& pool, int64_t tokens)
      : pool_(pool),
        tokens_(tokens),
        dtype_(pool.keys().pool.dtype),
        head_dim_(pool.keys().pool.head_dim) {}
  int64_t tokens() const override { return tokens_; }
  size_t row_bytes() const override { return static_cast<size_t>(head_dim_) * dtype_size(dtype_); }
  int32_t head_dim() const override { return head_dim_; }
  int32_t dtype() const override { return dtype_; }
  uint64_t bytes_held() const override { return 0; }
  uint64_t bytes_charged() const override { return 0; }
  int64_t shared_chunks() const override { return 0; }
  size_t chunk_count() const override { return 0; }

  void keys_as_float(int32_t head, int64_t first, int64_t count, float* out) const override {
    for (int64_t i = 0; i < count; ++i) read(first + i, head, out + i * head_dim_);
  }
  void keys_as_float(int32_t head, const int32_t* positions, int64_t count,
                     float* out) const override {
    for (int64_t i = 0; i < count; ++i) read(positions[i], head, out + i * head_dim_);
  }
  void keys_as_float(int32_t head, const int64_t* rows, int64_t count, float* out) const override {
    for (int64_t i = 0; i < count; ++i) read(rows[i], head, out + i * head_dim_);
  }

  void open(int64_t) override { not_read("a write"); }
  bool open_copies_last_chunk() const override { return false; }
  bool copy_in(int64_t, const pq_tensor&, const pq_tensor&, ThreadPool*) override {
    not_read("a write");
  }
  void expect(int64_t) override { not_read("a restore"); }
  void truncate(int64_t) noexcept override {}
  void truncate_under_readers(int64_t) noexcept override {}
  int64_t fork_from(const KvTier&) override { not_read("a fork"); }
  std::shared_ptr<const KeySnapshot> snapshot(int64_t) const override { not_read("a snapshot"); }
  void key_columns_as_float(int32_t, int64_t, int64_t, const int32_t*, int32_t,
                            float*) const override {
    not_read("a column read");
  }
  void gather(int32_t, const int32_t*, int64_t, uint8_t*, size_t, uint8_t*,
              size_t) const override {
    not_read("a gather");
  }
  SelectedRows select_rows(int32_t, const int32_t*, int64_t, RowStaging&) const override {
    not_read("a row table");
  }
  void for_each_run(bool, int32_t, int64_t, int64_t,
                    const std::function<void(const uint8_t*, int64_t)>&) const override {
    not_read("a run of rows");
  }

 private:
  void read(int64_t p, int32_t head, float* out) const {
    if (p < 0 || p >= tokens_)
      fail(PQ_ERR_INTERNAL, "exact key of position " + str(p) + " asked of a layer of " +
                                str(tokens_) + " tokens");
    to_float(pool_.row(p, head), dtype_, head_dim_, out, key_scale(head));
  }
  const PoolKeys& pool_;
  int64_t tokens_;
  int32_t dtype_, head_dim_;
};

}  // namespace

std::unique_ptr<KvTier> pool_key_reader(const PoolKeys& pool, int64_t tokens,
                                        const KvTier& layer) {
  auto reader = std::make_unique<PoolKeyReader>(pool, tokens);
  reader->set_scales(layer.key_scales(), pool.keys().pool.heads);
  return reader;
}

}  // namespace pq
