// The disk tier (PQ_KV_TIER_DISK, src/store/disk_tier.h) through the public
// API: every selector selects, fetches and attends exactly as over the host
// tier; state, fork, truncate and the memory limit work with it; a full disk
// and a failing read, injected through pq_hooks.disk_write / disk_read, are
// named errors that lose nothing already stored.
#include <dirent.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "api_test_util.h"

namespace {

using pqt::Ctx;
using pqt::Sel;

constexpr uint64_t kSeq = 7;

// A fresh directory for one test's K/V file, removed with what is left in it.
struct TempDir {
  std::string path;
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base != nullptr && *base ? base : "/tmp") + "/pqdisk-XXXXXX";
    if (mkdtemp(pattern.data()) != nullptr) path = pattern;
  }
  ~TempDir() {
    for (const std::string& name : entries()) ::unlink((path + "/" + name).c_str());
    ::rmdir(path.c_str());
  }
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    if (DIR* d = ::opendir(path.c_str())) {
      while (dirent* e = ::readdir(d))
        if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0)
          names.push_back(e->d_name);
      ::closedir(d);
    }
    return names;
  }
};

// Counts the file's transfers and fails them on demand.
struct DiskFaults {
  std::atomic<int64_t> reads{0}, writes{0};
  std::atomic<int64_t> writes_left{-1};  // -1: no limit; 0: every write fails (disk full)
  std::atomic<bool> fail_reads{false};
};

int64_t faulty_read(void* user, int fd, void* buf, uint64_t bytes, uint64_t offset) {
  auto* f = static_cast<DiskFaults*>(user);
  if (f->fail_reads.load()) return -EIO;
  f->reads.fetch_add(1);
  const ssize_t n = ::pread(fd, buf, bytes, static_cast<off_t>(offset));
  return n < 0 ? -errno : n;
}

int64_t faulty_write(void* user, int fd, const void* buf, uint64_t bytes, uint64_t offset) {
  auto* f = static_cast<DiskFaults*>(user);
  int64_t left = f->writes_left.load();
  if (left == 0) return -ENOSPC;
  if (left > 0) f->writes_left.store(left - 1);
  f->writes.fetch_add(1);
  // Half first: the library must ask again for the rest.
  const uint64_t part = bytes > 1 ? bytes / 2 : bytes;
  const ssize_t n = ::pwrite(fd, buf, part, static_cast<off_t>(offset));
  return n < 0 ? -errno : n;
}

pq_hooks hooks_for(DiskFaults* faults) {
  pq_hooks h;
  pq_hooks_default(&h);
  h.disk_read = faulty_read;
  h.disk_write = faulty_write;
  h.disk_user = faults;
  return h;
}

pq_config config_for(int32_t selector, int32_t tier, const std::string& dir) {
  pq_config c = pqt::make_config(1, 4, 2, 16, PQ_DTYPE_F32);
  c.selector = selector;
  c.sink_tokens = 4;
  c.local_tokens = 16;
  c.topk_tokens = 12;
  c.cluster_count = 16;
  c.worker_threads = 2;
  c.kv_tier = tier;
  c.kv_disk_path = tier == PQ_KV_TIER_DISK ? dir.c_str() : nullptr;
  return c;
}

// Keys and values of `tokens` tokens, [token][kv head][dim], and queries.
struct Data {
  std::vector<float> keys, values, queries;
};
Data make_data(const pq_config& c, int64_t tokens, int64_t queries, uint64_t seed) {
  const size_t kv = static_cast<size_t>(tokens) * c.num_kv_heads * c.head_dim;
  return {pqt::random_normal(kv, seed), pqt::random_normal(kv, seed + 1),
          pqt::random_normal(static_cast<size_t>(queries) * c.num_q_heads * c.head_dim, seed + 2)};
}

const float* row_of(const std::vector<float>& v, const pq_config& c, int64_t token) {
  return v.data() + static_cast<size_t>(token) * c.num_kv_heads * c.head_dim;
}

pq_status store(pq_context* ctx, uint64_t seq, const pq_config& c, const Data& d, int64_t first,
                int64_t count, bool prefill) {
  pqt::HostTensor k = pqt::make_tensor(row_of(d.keys, c, first), count, c.num_kv_heads, c.head_dim, c.dtype);
  pqt::HostTensor v = pqt::make_tensor(row_of(d.values, c, first), count, c.num_kv_heads, c.head_dim, c.dtype);
  return prefill ? pq_prefill_layer(ctx, seq, 0, k.get(), v.get())
                 : pq_decode_append(ctx, seq, 0, k.get(), v.get());
}

// What a decode step gives: the selection, the fetched rows, the attention.
struct Step {
  std::vector<int32_t> positions, counts;
  std::vector<float> keys, values, out, lse;
  pq_status status = PQ_OK;
};

Step step(pq_context* ctx, uint64_t seq, const pq_config& c, uint64_t query_seed) {
  Step s;
  const int64_t cap = pqt::selection_capacity(ctx, seq, 0);
  Sel sel(c.num_kv_heads, cap);
  std::vector<float> q = pqt::random_normal(static_cast<size_t>(c.num_q_heads) * c.head_dim, query_seed);
  pqt::HostTensor qt = pqt::make_tensor(q, 1, c.num_q_heads, c.head_dim, c.dtype);
  if ((s.status = pq_decode_select(ctx, seq, 0, qt.get(), sel.get())) != PQ_OK) return s;
  std::vector<float> zeros(static_cast<size_t>(cap) * c.num_kv_heads * c.head_dim, 0.f);
  pqt::HostTensor k = pqt::make_tensor(zeros, cap, c.num_kv_heads, c.head_dim, c.dtype);
  pqt::HostTensor v = pqt::make_tensor(zeros, cap, c.num_kv_heads, c.head_dim, c.dtype);
  if ((s.status = pq_fetch_kv(ctx, seq, 0, sel.get(), k.get(), v.get())) != PQ_OK) return s;
  s.out.resize(static_cast<size_t>(c.num_q_heads) * c.head_dim);
  s.lse.resize(static_cast<size_t>(c.num_q_heads));
  if ((s.status = pq_decode_attend(ctx, seq, 0, qt.get(), sel.get(), 0.25f, s.out.data(),
                                   s.lse.data())) != PQ_OK)
    return s;
  std::vector<float> probs(static_cast<size_t>(c.num_kv_heads * cap), 0.5f);
  s.status = pq_observe_attention(ctx, seq, 0, sel.get(), probs.data());
  s.positions = sel.positions;
  s.counts = sel.counts;
  for (int32_t h = 0; h < c.num_kv_heads; ++h)
    for (int32_t i = 0; i < sel.counts[static_cast<size_t>(h)]; ++i)
      for (const bool key : {true, false}) {
        const pqt::HostTensor& t = key ? k : v;
        const auto* r = reinterpret_cast<const float*>(t.row(i, h));
        (key ? s.keys : s.values).insert((key ? s.keys : s.values).end(), r, r + c.head_dim);
      }
  return s;
}

// Every row of positions [0, n) of `seq`, fetched by a hand-made selection.
std::vector<float> fetch_all(pq_context* ctx, uint64_t seq, const pq_config& c, int64_t n,
                             bool keys, pq_status* status) {
  Sel sel(c.num_kv_heads, n);
  for (int32_t h = 0; h < c.num_kv_heads; ++h) {
    sel.counts[static_cast<size_t>(h)] = static_cast<int32_t>(n);
    for (int64_t i = 0; i < n; ++i) sel.positions[static_cast<size_t>(h * n + i)] = static_cast<int32_t>(i);
  }
  std::vector<float> zeros(static_cast<size_t>(n) * c.num_kv_heads * c.head_dim, 0.f);
  pqt::HostTensor k = pqt::make_tensor(zeros, n, c.num_kv_heads, c.head_dim, c.dtype);
  pqt::HostTensor v = pqt::make_tensor(zeros, n, c.num_kv_heads, c.head_dim, c.dtype);
  *status = pq_fetch_kv(ctx, seq, 0, sel.get(), k.get(), v.get());
  std::vector<float> out(zeros.size());
  std::memcpy(out.data(), (keys ? k : v).bytes.data(), out.size() * sizeof(float));
  return out;
}

// The rows `want` holds for tokens [0, n) ([token][head][dim], as given).
std::vector<float> expected(const std::vector<float>& want, const pq_config& c, int64_t n) {
  return std::vector<float>(want.begin(), want.begin() + n * c.num_kv_heads * c.head_dim);
}

#define EXPECT_ROWS(ctx, seq, c, n, want_keys, want_values)                          \
  do {                                                                                \
    pq_status st_;                                                                    \
    EXPECT_EQ(fetch_all(ctx, seq, c, n, true, &st_), expected(want_keys, c, n));      \
    EXPECT_EQ(st_, PQ_OK) << pq_last_error();                                         \
    EXPECT_EQ(fetch_all(ctx, seq, c, n, false, &st_), expected(want_values, c, n));   \
    EXPECT_EQ(st_, PQ_OK) << pq_last_error();                                         \
  } while (0)

TEST(DiskTier, EverySelectorSelectsFetchesAndAttendsAsTheHostTier) {
  TempDir dir;
  ASSERT_FALSE(dir.path.empty());
  const int64_t P = 1100, steps = 40;  // chunks 1-3 of the prompt go to the file
  int32_t from_file = 0;  // selectors that selected rows in the file
  for (int32_t selector = 0; selector < PQ_SELECTOR_COUNT; ++selector) {
    SCOPED_TRACE("selector " + std::to_string(selector));
    DiskFaults faults;
    const pq_config hc = config_for(selector, PQ_KV_TIER_HOST, dir.path);
    const pq_config dc = config_for(selector, PQ_KV_TIER_DISK, dir.path);
    Ctx host(hc), disk(dc, hooks_for(&faults));
    ASSERT_TRUE(host.ok() && disk.ok()) << pq_last_error();
    const Data d = make_data(hc, P + steps, 24, 50 + static_cast<uint64_t>(selector));
    for (pq_context* ctx : {host.get(), disk.get()}) {
      PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
      PQ_ASSERT_OK(store(ctx, kSeq, hc, d, 0, P, true));
      pqt::HostTensor q = pqt::make_tensor(d.queries, 24, hc.num_q_heads, hc.head_dim, hc.dtype);
      PQ_ASSERT_OK(pq_prefill_queries(ctx, kSeq, 0, q.get()));
      PQ_ASSERT_OK(pq_wait_builds(ctx));
    }
    EXPECT_GT(faults.writes.load(), 0) << "no chunk reached the file";
    bool selected_from_file = false;  // a row of a chunk wholly before the window
    for (int64_t n = P; n <= P + steps; ++n) {
      if (n > P) {
        PQ_ASSERT_OK(store(host, kSeq, hc, d, n - 1, 1, false));
        PQ_ASSERT_OK(store(disk, kSeq, dc, d, n - 1, 1, false));
      }
      const Step a = step(host, kSeq, hc, static_cast<uint64_t>(n));
      const Step b = step(disk, kSeq, dc, static_cast<uint64_t>(n));
      ASSERT_EQ(a.status, PQ_OK) << pq_last_error();
      ASSERT_EQ(b.status, PQ_OK) << pq_last_error();
      ASSERT_EQ(a.counts, b.counts) << "n " << n;
      ASSERT_EQ(a.positions, b.positions) << "n " << n;
      ASSERT_EQ(a.keys, b.keys) << "n " << n;
      ASSERT_EQ(a.values, b.values) << "n " << n;
      ASSERT_EQ(a.out, b.out) << "n " << n;
      ASSERT_EQ(a.lse, b.lse) << "n " << n;
      const int64_t file_end = (n - dc.local_tokens) / 256 * 256;
      for (size_t h = 0; h < b.counts.size(); ++h)
        for (int32_t i = 0; i < b.counts[h]; ++i) {
          const int32_t p = b.positions[h * (b.positions.size() / b.counts.size()) + i];
          selected_from_file |= p >= 256 && p < file_end;
        }
    }
    // Selectors that keep to the window (and H2O-like ones fed flat
    // attention) may never select a row in the file; the others must have
    // read theirs from it.
    if (selected_from_file) EXPECT_GT(faults.reads.load(), 0) << "no row was read from the file";
    from_file += selected_from_file ? 1 : 0;
  }
  std::printf("selectors that selected rows in the file: %d of %d\n", from_file,
              PQ_SELECTOR_COUNT);
  EXPECT_GE(from_file, 12) << "too few selectors read rows back: the test proves little";
  EXPECT_TRUE(dir.entries().empty()) << "the K/V file has a name";
}

TEST(DiskTier, StateForkAndTruncateKeepEveryRow) {
  TempDir dir;
  const pq_config dc = config_for(PQ_SELECTOR_PQ, PQ_KV_TIER_DISK, dir.path);
  const pq_config hc = config_for(PQ_SELECTOR_PQ, PQ_KV_TIER_HOST, dir.path);
  Ctx disk(dc), host(hc);
  ASSERT_TRUE(disk.ok() && host.ok()) << pq_last_error();
  const int64_t P = 1500;
  const Data d = make_data(dc, P + 200, 1, 9), other = make_data(dc, P + 200, 1, 90);
  PQ_ASSERT_OK(pq_sequence_add(disk, kSeq));
  PQ_ASSERT_OK(store(disk, kSeq, dc, d, 0, P, true));
  PQ_ASSERT_OK(pq_wait_builds(disk));
  EXPECT_ROWS(disk, kSeq, dc, P, d.keys, d.values);

  // A fork shares the chunks in the file; each then goes its own way.
  PQ_ASSERT_OK(pq_sequence_fork(disk, kSeq, 8));
  PQ_ASSERT_OK(pq_sequence_truncate(disk, kSeq, 700));  // into a chunk in the file
  // The parent appends `other`'s rows from 700 on; the child `d`'s from P.
  Data parent = d;
  for (int64_t t = 700; t < 760; ++t) {
    PQ_ASSERT_OK(store(disk, kSeq, dc, other, t, 1, false));
    std::copy(row_of(other.keys, dc, t), row_of(other.keys, dc, t + 1),
              parent.keys.begin() + (row_of(parent.keys, dc, t) - parent.keys.data()));
    std::copy(row_of(other.values, dc, t), row_of(other.values, dc, t + 1),
              parent.values.begin() + (row_of(parent.values, dc, t) - parent.values.data()));
  }
  for (int64_t t = P; t < P + 100; ++t) PQ_ASSERT_OK(store(disk, 8, dc, d, t, 1, false));
  EXPECT_ROWS(disk, kSeq, dc, 760, parent.keys, parent.values);
  EXPECT_ROWS(disk, 8, dc, P + 100, d.keys, d.values);

  // Saved from the disk tier, restored into either tier.
  std::vector<unsigned char> saved;
  PQ_ASSERT_OK(pq_sequence_save(
      disk, 8,
      [](void* user, const void* data, size_t size) {
        auto* out = static_cast<std::vector<unsigned char>*>(user);
        out->insert(out->end(), static_cast<const unsigned char*>(data),
                    static_cast<const unsigned char*>(data) + size);
        return 0;
      },
      &saved));
  PQ_ASSERT_OK(pq_sequence_restore(disk, 9, saved.data(), saved.size()));
  PQ_ASSERT_OK(pq_sequence_restore(host, 9, saved.data(), saved.size()));
  EXPECT_ROWS(disk, 9, dc, P + 100, d.keys, d.values);
  EXPECT_ROWS(host, 9, hc, P + 100, d.keys, d.values);
  // The restored sequences select alike.
  const Step a = step(host, 9, hc, 3), b = step(disk, 9, dc, 3);
  ASSERT_EQ(a.status, PQ_OK);
  ASSERT_EQ(b.status, PQ_OK);
  EXPECT_EQ(a.positions, b.positions);
  EXPECT_EQ(a.out, b.out);
  PQ_EXPECT_OK(pq_sequence_remove(disk, kSeq));
  EXPECT_ROWS(disk, 8, dc, P + 100, d.keys, d.values);  // the shared chunks outlive the parent
}

TEST(DiskTier, HoldsTheWindowAndSinksOnlyAndTheLimitCountsThat) {
  TempDir dir;
  const int64_t P = 8192;  // 32 chunks
  uint64_t held[2] = {0, 0};
  for (int32_t tier : {PQ_KV_TIER_HOST, PQ_KV_TIER_DISK}) {
    const pq_config c = config_for(PQ_SELECTOR_PQ, tier, dir.path);
    Ctx ctx(c);
    ASSERT_TRUE(ctx.ok()) << pq_last_error();
    const Data d = make_data(c, P, 1, 5);
    PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
    PQ_ASSERT_OK(store(ctx, kSeq, c, d, 0, P, true));
    PQ_ASSERT_OK(pq_wait_builds(ctx));
    held[tier] = pqt::stats(ctx).host_bytes;
  }
  // The host tier holds 32 chunks of K/V; the disk tier the sink chunk and
  // the window's (two at most), plus the state of all 32.
  EXPECT_LT(held[PQ_KV_TIER_DISK] * 4, held[PQ_KV_TIER_HOST])
      << "host " << held[PQ_KV_TIER_HOST] << " disk " << held[PQ_KV_TIER_DISK];
  // A limit between the two: the disk tier stores the prompt, the host
  // tier refuses it.
  const uint64_t limit = (held[PQ_KV_TIER_HOST] + held[PQ_KV_TIER_DISK]) / 2;
  for (int32_t tier : {PQ_KV_TIER_HOST, PQ_KV_TIER_DISK}) {
    pq_config c = config_for(PQ_SELECTOR_PQ, tier, dir.path);
    c.host_memory_limit = limit;
    Ctx ctx(c);
    ASSERT_TRUE(ctx.ok()) << pq_last_error();
    const Data d = make_data(c, P, 1, 5);
    PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
    const pq_status st = store(ctx, kSeq, c, d, 0, P, true);
    if (tier == PQ_KV_TIER_HOST) {
      EXPECT_EQ(st, PQ_ERR_OUT_OF_MEMORY);
    } else {
      EXPECT_EQ(st, PQ_OK) << pq_last_error();
      PQ_EXPECT_OK(pq_wait_builds(ctx));
      EXPECT_LE(pqt::stats(ctx).host_bytes, limit);
      EXPECT_ROWS(ctx, kSeq, c, P, d.keys, d.values);
    }
  }
}

TEST(DiskTier, AFullDiskFailsTheAppendAndLosesNothing) {
  TempDir dir;
  DiskFaults faults;
  const pq_config c = config_for(PQ_SELECTOR_PQ, PQ_KV_TIER_DISK, dir.path);
  Ctx ctx(c, hooks_for(&faults));
  ASSERT_TRUE(ctx.ok()) << pq_last_error();
  const Data d = make_data(c, 1200, 1, 77);
  PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
  PQ_ASSERT_OK(store(ctx, kSeq, c, d, 0, 500, true));
  PQ_ASSERT_OK(pq_wait_builds(ctx));
  faults.writes_left.store(0);  // the disk is full from now on
  int64_t n = 500, failures = 0;
  for (; n < 800 && failures == 0; ++n) {
    const pq_status st = store(ctx, kSeq, c, d, n, 1, false);
    if (st != PQ_OK) {
      ++failures;
      EXPECT_EQ(st, PQ_ERR_BACKEND);
      EXPECT_TRUE(pqt::contains_ci(pq_last_error(), "No space left on device")) << pq_last_error();
      EXPECT_TRUE(pqt::contains_ci(pq_last_error(), dir.path)) << pq_last_error();
      int64_t length = -1;
      PQ_EXPECT_OK(pq_sequence_length(ctx, kSeq, 0, &length));
      EXPECT_EQ(length, n) << "the failed append left a token behind";
      EXPECT_ROWS(ctx, kSeq, c, n, d.keys, d.values);
      --n;  // the same token again, below
      faults.writes_left.store(-1);
    }
  }
  EXPECT_EQ(failures, 1) << "no append needed the file while the disk was full";
  EXPECT_ROWS(ctx, kSeq, c, n, d.keys, d.values);
  const Step s = step(ctx, kSeq, c, 1);
  EXPECT_EQ(s.status, PQ_OK) << pq_last_error();
}

TEST(DiskTier, AFailingReadIsANamedErrorAndLosesNothing) {
  TempDir dir;
  DiskFaults faults;
  const pq_config c = config_for(PQ_SELECTOR_EXACT, PQ_KV_TIER_DISK, dir.path);
  Ctx ctx(c, hooks_for(&faults));
  ASSERT_TRUE(ctx.ok()) << pq_last_error();
  const Data d = make_data(c, 1000, 1, 78);
  PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
  PQ_ASSERT_OK(store(ctx, kSeq, c, d, 0, 1000, true));
  faults.fail_reads.store(true);
  pq_status st;
  fetch_all(ctx, kSeq, c, 1000, true, &st);
  EXPECT_EQ(st, PQ_ERR_BACKEND);
  EXPECT_TRUE(pqt::contains_ci(pq_last_error(), "reading")) << pq_last_error();
  EXPECT_TRUE(pqt::contains_ci(pq_last_error(), dir.path)) << pq_last_error();
  const Step failed = step(ctx, kSeq, c, 2);  // the exact selector reads every middle key
  EXPECT_EQ(failed.status, PQ_ERR_BACKEND);
  faults.fail_reads.store(false);
  EXPECT_ROWS(ctx, kSeq, c, 1000, d.keys, d.values);
  const Step s = step(ctx, kSeq, c, 2);
  EXPECT_EQ(s.status, PQ_OK) << pq_last_error();
}

TEST(DiskTier, TheConfigurationIsChecked) {
  TempDir dir;
  pq_context* ctx = nullptr;
  pq_config c = config_for(PQ_SELECTOR_PQ, PQ_KV_TIER_DISK, dir.path);
  c.kv_disk_path = nullptr;
  EXPECT_EQ(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(pqt::contains_ci(pq_last_error(), "kv_disk_path")) << pq_last_error();
  const std::string missing = dir.path + "/no/such/dir";
  c.kv_disk_path = missing.c_str();
  EXPECT_EQ(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(pqt::contains_ci(pq_last_error(), missing)) << pq_last_error();
  c = config_for(PQ_SELECTOR_PQ, 3, dir.path);
  EXPECT_EQ(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(pqt::contains_ci(pq_last_error(), "kv_tier")) << pq_last_error();
  c = config_for(PQ_SELECTOR_PQ, PQ_KV_TIER_DISK, dir.path);
  c.backend = PQ_BACKEND_CUDA;
  EXPECT_EQ(pq_create(&c, &ctx), PQ_ERR_UNSUPPORTED);
  EXPECT_TRUE(pqt::contains_ci(pq_last_error(), "kv_tier")) << pq_last_error();
  EXPECT_EQ(ctx, nullptr);
  pq_config got;
  c = config_for(PQ_SELECTOR_PQ, PQ_KV_TIER_DISK, dir.path);
  Ctx ok(c);
  ASSERT_TRUE(ok.ok()) << pq_last_error();
  got.struct_size = sizeof got;
  PQ_ASSERT_OK(pq_get_config(ok, &got));
  EXPECT_EQ(got.kv_tier, PQ_KV_TIER_DISK);
  EXPECT_EQ(got.kv_disk_path, nullptr) << "a path the context does not keep";
}

}  // namespace
