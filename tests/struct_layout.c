/* Prints the size of every public struct and the offset of each field, one
 * "struct field offset" line each, so that bindings not written by the C
 * compiler (the Rust crate) can be checked against what it lays out.
 * The fields come from public_fields.h, where a new field is added once. */
#include <stddef.h>
#include <stdio.h>

#include "pqcache.h"
#include "public_fields.h"

#define SIZE(s) printf("%s sizeof %zu\n", #s, sizeof(s));
#define FIELD(s, f) printf("%s %s %zu\n", #s, #f, offsetof(s, f));

int main(void) {
  PQ_PUBLIC_STRUCTS(SIZE)
  PQ_PUBLIC_FIELDS(FIELD)
  return 0;
}
