// The CUDA backend's decode step on a real GPU through the public API: the
// step kept on the device (pq_decode_select_device + pq_fetch_kv_device)
// against the host-positions step on the same context, and a batch of
// sequences in one launch chain (pq_decode_select_batch, pq_fetch_kv_batch)
// against per-sequence calls, and the step captured in a CUDA graph
// replayed as the sequence grows. Without a GPU every test reports SKIPPED with
// the reason (the same logic runs on every build through the host fake of
// the plug-in: tests/cuda_fake).
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <pqcache.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "api_gpu_util.h"

namespace {

void prefill(pq_context* ctx, uint64_t id, int64_t tokens) {
  ASSERT_EQ(pq_sequence_add(ctx, id), PQ_OK);
  const std::vector<uint16_t> k = random_f16(static_cast<size_t>(tokens) * kKvHeads * kDim, id);
  const std::vector<uint16_t> v = random_f16(k.size(), id + 1000);
  pq_tensor kt, vt;
  pq_tensor_init(&kt, const_cast<uint16_t*>(k.data()), PQ_DTYPE_F16, PQ_LAYOUT_TOKEN_MAJOR, tokens,
                 kKvHeads, kDim);
  pq_tensor_init(&vt, const_cast<uint16_t*>(v.data()), PQ_DTYPE_F16, PQ_LAYOUT_TOKEN_MAJOR, tokens,
                 kKvHeads, kDim);
  ASSERT_EQ(pq_prefill_layer(ctx, id, 0, &kt, &vt), PQ_OK) << pq_last_error();
  ASSERT_EQ(pq_wait_builds(ctx), PQ_OK);
}

// MAX and MEAN combine bit-identically on the device and the host (the LUT
// too), so the device-resident step must select exactly the host step's
// positions and fetch the same bytes.
TEST(CudaDeviceStep, DeviceSelectionAndFetchEqualTheHostStep) {
  REQUIRE_GPU();
  for (int32_t combine : {PQ_GQA_MAX, PQ_GQA_MEAN}) {
    pq_context* ctx = make_context(combine);
    ASSERT_NE(ctx, nullptr);
    prefill(ctx, 1, 20000);
    int64_t cap = 0;
    ASSERT_EQ(pq_selection_capacity(ctx, 1, 0, &cap), PQ_OK);
    const std::vector<uint16_t> q = random_f16(static_cast<size_t>(kQHeads) * kDim, 77);
    pq_tensor hq;
    pq_tensor_init(&hq, const_cast<uint16_t*>(q.data()), PQ_DTYPE_F16, PQ_LAYOUT_TOKEN_MAJOR, 1,
                   kQHeads, kDim);
    std::vector<int32_t> pos(kKvHeads * cap), cnt(kKvHeads);
    pq_selection host{pos.data(), cnt.data(), cap};
    ASSERT_EQ(pq_decode_select(ctx, 1, 0, &hq, &host), PQ_OK) << pq_last_error();

    Dev<uint16_t> dq(q.size(), q.data());
    pq_tensor query = hq;
    query.data = dq.p, query.memory = PQ_MEMORY_DEVICE;
    Dev<int32_t> dpos(kKvHeads * cap), dcnt(kKvHeads);
    pq_selection device{dpos.p, dcnt.p, cap};
    ASSERT_EQ(pq_decode_select_device(ctx, 1, 0, &query, &device), PQ_OK) << pq_last_error();
    Dev<uint16_t> k1(kKvHeads * cap * kDim), v1(k1.n), k2(k1.n), v2(k1.n);
    pq_tensor ok1;
    pq_tensor_init(&ok1, k1.p, PQ_DTYPE_F16, PQ_LAYOUT_HEAD_MAJOR, cap, kKvHeads, kDim);
    ok1.memory = PQ_MEMORY_DEVICE;
    pq_tensor ov1 = ok1, ok2 = ok1, ov2 = ok1;
    ov1.data = v1.p, ok2.data = k2.p, ov2.data = v2.p;
    ASSERT_EQ(pq_fetch_kv_device(ctx, 1, 0, &device, &ok2, &ov2), PQ_OK) << pq_last_error();
    ASSERT_EQ(pq_fetch_kv(ctx, 1, 0, &host, &ok1, &ov1), PQ_OK) << pq_last_error();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(dcnt.get(), cnt) << "combine " << combine;
    EXPECT_EQ(dpos.get(), pos) << "combine " << combine;
    EXPECT_TRUE(k1.get() == k2.get()) << "combine " << combine << ": fetched keys differ";
    EXPECT_TRUE(v1.get() == v2.get()) << "combine " << combine << ": fetched values differ";
    pq_destroy(ctx);
  }
}

// A batch of 8 sequences of different lengths: one launch chain selects
// what 8 per-sequence calls select, and one gather fetches the same bytes.
TEST(CudaDeviceStep, BatchedSelectAndFetchEqualPerSequenceCalls) {
  REQUIRE_GPU();
  pq_context* ctx = make_context(PQ_GQA_SUM_SOFTMAX);
  ASSERT_NE(ctx, nullptr);
  const int n = 8;
  std::vector<int64_t> caps(n);
  for (int i = 0; i < n; ++i) {
    prefill(ctx, 10 + i, 3000 + 1700 * i);
    ASSERT_EQ(pq_selection_capacity(ctx, 10 + i, 0, &caps[i]), PQ_OK);
  }
  const std::vector<uint16_t> q = random_f16(static_cast<size_t>(kQHeads) * kDim, 5);
  pq_tensor hq;
  pq_tensor_init(&hq, const_cast<uint16_t*>(q.data()), PQ_DTYPE_F16, PQ_LAYOUT_TOKEN_MAJOR, 1,
                 kQHeads, kDim);
  std::vector<std::vector<int32_t>> pos1(n), cnt1(n), pos2(n), cnt2(n);
  std::vector<pq_select_item> items(n);
  for (int i = 0; i < n; ++i) {
    pos1[i].assign(kKvHeads * caps[i], -1), cnt1[i].assign(kKvHeads, -1);
    pos2[i] = pos1[i], cnt2[i] = cnt1[i];
    pq_selection one{pos1[i].data(), cnt1[i].data(), caps[i]};
    ASSERT_EQ(pq_decode_select(ctx, 10 + i, 0, &hq, &one), PQ_OK) << pq_last_error();
    items[i].seq_id = 10 + i;
    items[i].query = hq;
    items[i].out = pq_selection{pos2[i].data(), cnt2[i].data(), caps[i]};
  }
  ASSERT_EQ(pq_decode_select_batch(ctx, 0, items.data(), n), PQ_OK) << pq_last_error();
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(cnt2[i], cnt1[i]) << "item " << i;
    EXPECT_EQ(pos2[i], pos1[i]) << "item " << i;
  }
  std::vector<std::unique_ptr<Dev<uint16_t>>> outs;
  std::vector<pq_fetch_item> fetch(n);
  for (int i = 0; i < n; ++i) {
    for (int t = 0; t < 4; ++t)
      outs.push_back(std::make_unique<Dev<uint16_t>>(kKvHeads * caps[i] * kDim));
    // pq_tensor_init refuses NULL data for tokens > 0 and leaves t as it
    // was: give it a buffer (the first run on a GPU found t uninitialised).
    pq_tensor t;
    ASSERT_EQ(pq_tensor_init(&t, outs[4 * i]->p, PQ_DTYPE_F16, PQ_LAYOUT_HEAD_MAJOR, caps[i],
                             kKvHeads, kDim),
              PQ_OK)
        << pq_last_error();
    t.memory = PQ_MEMORY_DEVICE;
    pq_tensor k1 = t, v1 = t;
    k1.data = outs[4 * i]->p, v1.data = outs[4 * i + 1]->p;
    pq_selection one{pos1[i].data(), cnt1[i].data(), caps[i]};
    ASSERT_EQ(pq_fetch_kv(ctx, 10 + i, 0, &one, &k1, &v1), PQ_OK) << pq_last_error();
    fetch[i].seq_id = 10 + i;
    fetch[i].selection = one;
    fetch[i].out_keys = t, fetch[i].out_values = t;
    fetch[i].out_keys.data = outs[4 * i + 2]->p, fetch[i].out_values.data = outs[4 * i + 3]->p;
  }
  ASSERT_EQ(pq_fetch_kv_batch(ctx, 0, fetch.data(), n), PQ_OK) << pq_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int i = 0; i < n; ++i) {
    EXPECT_TRUE(outs[4 * i]->get() == outs[4 * i + 2]->get()) << "item " << i << " keys";
    EXPECT_TRUE(outs[4 * i + 1]->get() == outs[4 * i + 3]->get()) << "item " << i << " values";
  }
  pq_destroy(ctx);
}

// The step of 0.8 an engine captures in a CUDA graph: after a reserve and
// one uncaptured step with the engine's buffers, select + fetch captured
// once and replayed after each of 100 appends (host K/V for one, device K/V
// for the next) select and fetch what the host-positions step selects and
// fetches at that length (MAX combine: bit-identical on both sides).
TEST(CudaDeviceStep, CapturedStepReplayedFor100TokensEqualsTheHostStep) {
  REQUIRE_GPU();
  pq_context* ctx = make_context(PQ_GQA_MAX);
  ASSERT_NE(ctx, nullptr);
  prefill(ctx, 1, 8000);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(pq_sequence_set_stream(ctx, 1, stream), PQ_OK);
  constexpr int kTokens = 100;
  ASSERT_EQ(pq_sequence_reserve(ctx, 1, 8000 + kTokens + 1), PQ_OK) << pq_last_error();
  int64_t cap = 0;
  ASSERT_EQ(pq_selection_capacity_for(ctx, 0, 8000 + kTokens, &cap), PQ_OK);
  Dev<uint16_t> dq(static_cast<size_t>(kQHeads) * kDim);
  Dev<int32_t> dpos(kKvHeads * cap), dcnt(kKvHeads);
  Dev<uint16_t> dk(kKvHeads * cap * kDim), dv(dk.n), hk(dk.n), hv(dk.n);
  Dev<uint16_t> tok_k(kKvHeads * kDim), tok_v(tok_k.n);
  pq_tensor query, keys, values, out;
  pq_tensor_init(&query, dq.p, PQ_DTYPE_F16, PQ_LAYOUT_TOKEN_MAJOR, 1, kQHeads, kDim);
  query.memory = PQ_MEMORY_DEVICE;
  pq_tensor_init(&out, dk.p, PQ_DTYPE_F16, PQ_LAYOUT_HEAD_MAJOR, cap, kKvHeads, kDim);
  out.memory = PQ_MEMORY_DEVICE;
  pq_tensor ok = out, ov = out, hok = out, hov = out;
  ov.data = dv.p, hok.data = hk.p, hov.data = hv.p;
  pq_selection device{dpos.p, dcnt.p, cap};
  ASSERT_EQ(pq_decode_select_device(ctx, 1, 0, &query, &device), PQ_OK) << pq_last_error();
  ASSERT_EQ(pq_fetch_kv_device(ctx, 1, 0, &device, &ok, &ov), PQ_OK) << pq_last_error();
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  const pq_status s1 = pq_decode_select_device(ctx, 1, 0, &query, &device);
  const std::string e1 = pq_last_error();
  const pq_status s2 = pq_fetch_kv_device(ctx, 1, 0, &device, &ok, &ov);
  const std::string e2 = pq_last_error();
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(s1, PQ_OK) << e1;
  ASSERT_EQ(s2, PQ_OK) << e2;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int token = 1; token <= kTokens; ++token) {
    SCOPED_TRACE("token " + std::to_string(token));
    const std::vector<uint16_t> k = random_f16(tok_k.n, 5000 + token);
    const std::vector<uint16_t> v = random_f16(tok_v.n, 9000 + token);
    const std::vector<uint16_t> q = random_f16(dq.n, 7000 + token);
    pq_tensor_init(&keys, const_cast<uint16_t*>(k.data()), PQ_DTYPE_F16, PQ_LAYOUT_TOKEN_MAJOR, 1,
                   kKvHeads, kDim);
    pq_tensor_init(&values, const_cast<uint16_t*>(v.data()), PQ_DTYPE_F16,
                   PQ_LAYOUT_TOKEN_MAJOR, 1, kKvHeads, kDim);
    if (token % 2 == 0) {  // the engine's own K/V, on the device
      ASSERT_EQ(cudaMemcpy(tok_k.p, k.data(), k.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(tok_v.p, v.data(), v.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
      keys.data = tok_k.p, values.data = tok_v.p;
      keys.memory = values.memory = PQ_MEMORY_DEVICE;
    }
    ASSERT_EQ(pq_decode_append(ctx, 1, 0, &keys, &values), PQ_OK) << pq_last_error();
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dq.p, q.data(), q.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    pq_tensor hq;
    pq_tensor_init(&hq, const_cast<uint16_t*>(q.data()), PQ_DTYPE_F16, PQ_LAYOUT_TOKEN_MAJOR, 1,
                   kQHeads, kDim);
    std::vector<int32_t> pos(kKvHeads * cap, -1), cnt(kKvHeads, -1);
    pq_selection host{pos.data(), cnt.data(), cap};
    ASSERT_EQ(pq_decode_select(ctx, 1, 0, &hq, &host), PQ_OK) << pq_last_error();
    ASSERT_EQ(pq_fetch_kv(ctx, 1, 0, &host, &hok, &hov), PQ_OK) << pq_last_error();
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const std::vector<int32_t> got_cnt = dcnt.get(), got_pos = dpos.get();
    ASSERT_EQ(got_cnt, cnt);
    for (int32_t h = 0; h < kKvHeads; ++h)
      ASSERT_TRUE(std::equal(pos.begin() + h * cap, pos.begin() + h * cap + cnt[h],
                             got_pos.begin() + h * cap))
          << "head " << h << ": the replay selected other tokens";
    const std::vector<uint16_t> gk = dk.get(), wk = hk.get();
    for (int32_t h = 0; h < kKvHeads; ++h)
      ASSERT_TRUE(std::equal(wk.begin() + h * cap * kDim, wk.begin() + (h * cap + cnt[h]) * kDim,
                             gk.begin() + h * cap * kDim))
          << "head " << h << ": the replay fetched other keys";
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  ASSERT_EQ(pq_sequence_set_stream(ctx, 1, nullptr), PQ_OK);
  pq_destroy(ctx);
  cudaStreamDestroy(stream);
}

// Issue 42: with the rotate-half pairing and exact re-ranking, the device
// step (single, batched, and captured then replayed as the sequence grows)
// selects what the host-positions step of the same context selects: the
// LUT is the host's bit for bit, the scan and the top-k of the candidates
// are the same kernels on both paths, and the device re-ranking is the
// host's arithmetic (its SUM_SOFTMAX sums in the CPU's eight lanes), so the
// positions are equal for every combine, not within a tolerance.
TEST(CudaDeviceStep, RotateHalfAndReRankingOnTheDeviceEqualTheHostStep) {
  REQUIRE_GPU();
  auto host_select = [](pq_context* ctx, uint64_t id, const std::vector<uint16_t>& q, int64_t cap,
                        std::vector<int32_t>* pos, std::vector<int32_t>* cnt) {
    pq_tensor hq;
    pq_tensor_init(&hq, const_cast<uint16_t*>(q.data()), PQ_DTYPE_F16, PQ_LAYOUT_TOKEN_MAJOR, 1,
                   kQHeads, kDim);
    pos->assign(kKvHeads * cap, -1), cnt->assign(kKvHeads, -1);
    pq_selection host{pos->data(), cnt->data(), cap};
    EXPECT_EQ(pq_decode_select(ctx, id, 0, &hq, &host), PQ_OK) << pq_last_error();
  };
  auto expect_rows = [](const std::vector<int32_t>& want_pos, const std::vector<int32_t>& want_cnt,
                        const std::vector<int32_t>& got_pos, const std::vector<int32_t>& got_cnt,
                        int64_t cap, const std::string& what) {
    ASSERT_EQ(got_cnt, want_cnt) << what;
    for (int32_t h = 0; h < kKvHeads; ++h)
      ASSERT_TRUE(std::equal(want_pos.begin() + h * cap, want_pos.begin() + h * cap + want_cnt[h],
                             got_pos.begin() + h * cap))
          << what << ", head " << h;
  };
  for (int32_t combine : {PQ_GQA_SUM_SOFTMAX, PQ_GQA_MAX, PQ_GQA_MEAN})
    for (float rerank : {0.f, 1.f}) {
      SCOPED_TRACE("combine " + std::to_string(combine) + " rerank " + std::to_string(rerank));
      pq_context* ctx = make_context(combine, PQ_ROTARY_HALF, rerank);
      ASSERT_NE(ctx, nullptr);
      prefill(ctx, 1, 20000);
      prefill(ctx, 2, 9000);
      int64_t cap = 0;
      ASSERT_EQ(pq_selection_capacity(ctx, 1, 0, &cap), PQ_OK);
      const std::vector<uint16_t> q = random_f16(static_cast<size_t>(kQHeads) * kDim, 31);
      Dev<uint16_t> dq(q.size(), q.data());
      pq_tensor query;
      pq_tensor_init(&query, dq.p, PQ_DTYPE_F16, PQ_LAYOUT_TOKEN_MAJOR, 1, kQHeads, kDim);
      query.memory = PQ_MEMORY_DEVICE;
      // Single and batched, against each sequence's host step.
      std::vector<int32_t> pos[2], cnt[2];
      for (int i = 0; i < 2; ++i) host_select(ctx, 1 + i, q, cap, &pos[i], &cnt[i]);
      Dev<int32_t> dpos(kKvHeads * cap), dcnt(kKvHeads), bpos0(dpos.n), bcnt0(kKvHeads),
          bpos1(dpos.n), bcnt1(kKvHeads);
      pq_selection device{dpos.p, dcnt.p, cap};
      ASSERT_EQ(pq_decode_select_device(ctx, 1, 0, &query, &device), PQ_OK) << pq_last_error();
      pq_select_item items[2] = {{1, query, {bpos0.p, bcnt0.p, cap}, PQ_ERR_INTERNAL},
                                 {2, query, {bpos1.p, bcnt1.p, cap}, PQ_ERR_INTERNAL}};
      ASSERT_EQ(pq_decode_select_device_batch(ctx, 0, items, 2), PQ_OK) << pq_last_error();
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      expect_rows(pos[0], cnt[0], dpos.get(), dcnt.get(), cap, "single");
      expect_rows(pos[0], cnt[0], bpos0.get(), bcnt0.get(), cap, "batch item 0");
      expect_rows(pos[1], cnt[1], bpos1.get(), bcnt1.get(), cap, "batch item 1");
      if (HasFatalFailure()) return;
      // Captured after a reserve, replayed after each of 20 appends.
      cudaStream_t stream;
      ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
      ASSERT_EQ(pq_sequence_set_stream(ctx, 1, stream), PQ_OK);
      constexpr int kTokens = 20;
      ASSERT_EQ(pq_sequence_reserve(ctx, 1, 20000 + kTokens + 1), PQ_OK) << pq_last_error();
      int64_t step_cap = 0;
      ASSERT_EQ(pq_selection_capacity_for(ctx, 0, 20000 + kTokens, &step_cap), PQ_OK);
      Dev<int32_t> spos(kKvHeads * step_cap), scnt(kKvHeads);
      pq_selection step{spos.p, scnt.p, step_cap};
      ASSERT_EQ(pq_decode_select_device(ctx, 1, 0, &query, &step), PQ_OK) << pq_last_error();
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
      const pq_status captured = pq_decode_select_device(ctx, 1, 0, &query, &step);
      const std::string error = pq_last_error();
      ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
      ASSERT_EQ(captured, PQ_OK) << error;
      ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
      for (int token = 1; token <= kTokens; ++token) {
        SCOPED_TRACE("token " + std::to_string(token));
        const std::vector<uint16_t> k = random_f16(kKvHeads * kDim, 5000 + token);
        const std::vector<uint16_t> v = random_f16(kKvHeads * kDim, 9000 + token);
        const std::vector<uint16_t> tq = random_f16(q.size(), 7000 + token);
        pq_tensor keys, values;
        pq_tensor_init(&keys, const_cast<uint16_t*>(k.data()), PQ_DTYPE_F16,
                       PQ_LAYOUT_TOKEN_MAJOR, 1, kKvHeads, kDim);
        pq_tensor_init(&values, const_cast<uint16_t*>(v.data()), PQ_DTYPE_F16,
                       PQ_LAYOUT_TOKEN_MAJOR, 1, kKvHeads, kDim);
        ASSERT_EQ(pq_decode_append(ctx, 1, 0, &keys, &values), PQ_OK) << pq_last_error();
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(dq.p, tq.data(), tq.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
        ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        std::vector<int32_t> want_pos, want_cnt;
        host_select(ctx, 1, tq, step_cap, &want_pos, &want_cnt);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        expect_rows(want_pos, want_cnt, spos.get(), scnt.get(), step_cap, "replay");
        if (HasFatalFailure()) return;
      }
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
      ASSERT_EQ(pq_sequence_set_stream(ctx, 1, nullptr), PQ_OK);
      pq_destroy(ctx);
      cudaStreamDestroy(stream);
    }
}

}  // namespace
