// The one place exceptions become statuses: catch_status, with guarded (the
// C API boundary) and a batch item's outcome built on it, keeps what() of
// every exception it maps.
#include <gtest/gtest.h>

#include <new>
#include <stdexcept>
#include <string>

#include "base/error.h"
#include "pqcache.h"

namespace {

struct Reported {
  std::string text;
  pq_status status = PQ_OK;
};

template <typename Body>
Reported run(Body&& body) {
  Reported r;
  r.status = pq::catch_status(body, [&r](const char* what, const char* prefix) {
    r.text = std::string(prefix) + what;
  });
  return r;
}

TEST(CatchStatus, ALibraryErrorKeepsItsStatusAndText) {
  const Reported r = run([] { pq::fail(PQ_ERR_BUFFER_TOO_SMALL, "out->capacity is 3"); });
  EXPECT_EQ(r.status, PQ_ERR_BUFFER_TOO_SMALL);
  EXPECT_EQ(r.text, "out->capacity is 3");
}

TEST(CatchStatus, AnyOtherExceptionIsInternalAndKeepsWhat) {
  const Reported r = run([] { throw std::out_of_range("vector::at: 7 >= 4"); });
  EXPECT_EQ(r.status, PQ_ERR_INTERNAL);
  EXPECT_EQ(r.text, "internal error: vector::at: 7 >= 4");
  const Reported unknown = run([] { throw 42; });
  EXPECT_EQ(unknown.status, PQ_ERR_INTERNAL);
  EXPECT_EQ(unknown.text, "internal error: unknown exception");
}

TEST(CatchStatus, BadAllocIsOutOfMemory) {
  const Reported r = run([] { throw std::bad_alloc(); });
  EXPECT_EQ(r.status, PQ_ERR_OUT_OF_MEMORY);
  EXPECT_EQ(r.text, "out of host memory (allocation failed)");
}

TEST(CatchStatus, SuccessReportsNothing) {
  bool ran = false;
  const Reported r = run([&] { ran = true; });
  EXPECT_TRUE(ran);
  EXPECT_EQ(r.status, PQ_OK);
  EXPECT_TRUE(r.text.empty());
}

TEST(Guarded, TheMessageNamesTheFunction) {
  const pq_status s = pq::guarded("pq_fetch_kv", [] { throw std::logic_error("broken"); });
  EXPECT_EQ(s, PQ_ERR_INTERNAL);
  EXPECT_STREQ(pq_last_error(), "pq_fetch_kv: internal error: broken");
}

}  // namespace
