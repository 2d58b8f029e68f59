/* README.md's state snippet after the walkthrough's select; checks what it
 * left: sequence 1 restored at 4096 tokens, its fork 2 at 4096. */
#include "c_session.h"

int main(void) {
  int32_t l = 1;
  pq_tensor q;
  pq_selection sel;
  pq_context* ctx = session(l, &q, &sel);
  int64_t tokens1 = 0, tokens2 = 0;
  {
@SNIPPET@
  }
  check(pq_sequence_length(ctx, 1, l, &tokens1));
  check(pq_sequence_length(ctx, 2, l, &tokens2));
  check(pq_decode_select(ctx, 1, l, &q, &sel));  /* the restored sequence selects */
  printf("sequence 1: %lld tokens (restored), sequence 2: %lld tokens (forked)\n",
         (long long)tokens1, (long long)tokens2);
  pq_destroy(ctx);
  return tokens1 == 4096 && tokens2 == 4096 ? 0 : 1;
}
