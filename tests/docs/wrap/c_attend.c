/* README.md's attend snippet after the walkthrough's select; checks its output. */
#include "c_session.h"

int main(void) {
  int32_t l = 1;
  pq_tensor q;
  pq_selection sel;
  pq_context* ctx = session(l, &q, &sel);
  int h;
  {
@SNIPPET@
    for (h = 0; h < QH; ++h)
      if (!isfinite(lse[h]) || !isfinite(out[h * DIM])) {
        fprintf(stderr, "query head %d: lse %g, out[0] %g\n", h, lse[h], out[h * DIM]);
        return 1;
      }
    printf("attended: lse[0] %.3f, out[0][0] %.4f\n", lse[0], out[0]);
  }
  pq_destroy(ctx);
  return 0;
}
