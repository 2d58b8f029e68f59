#include "store/kv_tier.h"

#include "base/error.h"
#include "base/tensor.h"

namespace pq {

void KvTier::append(const pq_tensor& keys, const pq_tensor& values, ThreadPool* pool) {
  const int64_t count = keys.tokens;
  if (count <= 0) return;
  const int64_t first = tokens();
  open(count);
  bool finite;
  try {
    finite = copy_in(first, keys, values, pool);
  } catch (...) {
    truncate(first);  // a full disk among the causes: the tier is as it was
    throw;
  }
  if (!finite) {
    truncate(first);  // as if the call never came
    reject_non_finite(keys, "keys");  // names the first bad element
    reject_non_finite(values, "values");
    fail(PQ_ERR_INTERNAL, "a non-finite value was seen while storing but not found again");
  }
}

}  // namespace pq
