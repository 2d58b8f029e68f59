// A selector's state is typed: a missing or foreign state is an internal
// error with a message, never a downcast that silently does nothing or
// reads another selector's memory.
#include <gtest/gtest.h>

#include "base/error.h"
#include "store/kv_store.h"
#include "selectors/selector.h"

namespace {

pq_config small_config() {
  pq_config c;
  pq_config_default(&c);
  c.num_layers = 1;
  c.num_q_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 8;
  return c;
}

pq_status status_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const pq::Error& e) {
    return e.status();
  }
  return PQ_OK;
}

TEST(SelectorState, MissingOrForeignStateIsAnInternalError) {
  const pq_config c = small_config();
  pq::KvStore store(c.num_kv_heads, c.head_dim, c.dtype, nullptr, 0);
  for (const pq::SelectorInfo& info : pq::selector_registry()) {
    std::unique_ptr<pq::Selector> selector = info.make();
    std::unique_ptr<pq::SelectorState> own = selector->make_state(c, 0);
    if (!own) continue;  // keeps no state
    SCOPED_TRACE(info.name);
    // A state of another selector that keeps one.
    std::unique_ptr<pq::SelectorState> foreign;
    for (const pq::SelectorInfo& other : pq::selector_registry()) {
      if (other.value == info.value) continue;
      std::unique_ptr<pq::SelectorState> s = other.make()->make_state(c, 0);
      if (s && typeid(*s) != typeid(*own)) {
        foreign = std::move(s);
        break;
      }
    }
    ASSERT_TRUE(foreign);
    const float probs[1] = {1.f};
    const int32_t positions[1] = {0};
    EXPECT_EQ(PQ_ERR_INTERNAL, status_of([&] {
                selector->observe_attention(nullptr, 0, positions, probs, 1);
                selector->update_state(nullptr, store, 0, 0, 0, c);
              }));
    EXPECT_EQ(PQ_ERR_INTERNAL, status_of([&] {
                selector->observe_attention(foreign.get(), 0, positions, probs, 1);
                selector->update_state(foreign.get(), store, 0, 0, 0, c);
              }));
  }
}

}  // namespace
