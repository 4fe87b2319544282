/* Bad input through the C ABI: every call is answered with an error code and a message,
 * never a crash. Prints "bad_input: ok" and exits 0 when every answer is the expected one. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tunecache.h"

static int failures = 0;

#define EXPECT(call, want)                                                                   \
  do {                                                                                       \
    int got_ = (call);                                                                       \
    if (got_ != (want)) {                                                                    \
      char msg_[256];                                                                        \
      tc_last_error(msg_, sizeof msg_);                                                      \
      fprintf(stderr, "FAIL line %d: %s = %d, want %d (%s)\n", __LINE__, #call, got_, want,  \
              msg_);                                                                         \
      failures++;                                                                            \
    }                                                                                        \
  } while (0)

#define CHECK(cond)                                                        \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "FAIL line %d: %s\n", __LINE__, #cond);              \
      failures++;                                                          \
    }                                                                      \
  } while (0)

struct key { int m, n, k; char dtype[4]; };

static size_t error_len(void) { return tc_last_error(NULL, 0); }

int main(int argc, char** argv) {
  const char* path = argc > 1 ? argv[1] : "bad_input.tcache";
  tc_cache* cache = NULL;
  tc_ns* ns = NULL;
  struct key key;
  tc_options options;
  memset(&options, 0, sizeof options);
  memset(&key, 0, sizeof key);
  key.m = 128; key.n = 256; key.k = 64; memcpy(key.dtype, "f16", 4);

  CHECK(tc_abi_version() == TC_ABI_VERSION);

  /* Opening. */
  EXPECT(tc_open(NULL, 1, NULL, path, NULL, &cache), TC_E_NULL);
  CHECK(error_len() > 0);
  EXPECT(tc_open("app", 1, NULL, path, NULL, NULL), TC_E_NULL);
  EXPECT(tc_open("", 1, NULL, path, NULL, &cache), TC_E_ARG);
  EXPECT(tc_open("app", 1, NULL, path, &options, &cache), TC_E_ARG); /* size not set */
  options.size = sizeof options;
  options.migrations_json = "{not json";
  EXPECT(tc_open("app", 1, NULL, path, &options, &cache), TC_E_ARG);
  options.migrations_json = NULL;
  EXPECT(tc_open("app", 1, NULL, "\xff\xfe", &options, &cache), TC_E_ARG); /* not UTF-8 */
  {
    /* A shared tier's address that is not usable: opened without one, with a warning. */
    tc_cache* no_remote = NULL;
    options.remote = "nonsense://nowhere";
    EXPECT(tc_open("app", 1, NULL, path, &options, &no_remote), TC_OK);
    EXPECT(tc_mode(no_remote), TC_MODE_PERSISTENT);
    EXPECT(tc_close(no_remote), TC_OK);
    options.remote = NULL;
  }

  {
    /* A caller compiled against an older, shorter tc_options (only size and read_only):
       what it has is read, the rest is the default; nothing past its struct is read (the
       sanitizer build would see it). A size that cannot hold `size` itself is refused. */
    struct { uint32_t size; uint32_t read_only; } older = { 8, 1 };
    tc_cache* old_caller = NULL;
    EXPECT(tc_open("app", 1, NULL, path, (const tc_options*)(const void*)&older, &old_caller), TC_OK);
    EXPECT(tc_mode(old_caller), TC_MODE_READ_ONLY);
    EXPECT(tc_close(old_caller), TC_OK);
    uint32_t tiny = 2;
    EXPECT(tc_open("app", 1, NULL, path, (const tc_options*)(const void*)&tiny, &old_caller), TC_E_ARG);
  }

  /* An unusable location degrades to memory, with a warning. */
  tc_cache* memory = NULL;
  EXPECT(tc_open("app", 1, NULL, "/proc/self/status/x.tcache", NULL, &memory), TC_OK);
  EXPECT(tc_mode(memory), TC_MODE_MEMORY);
  {
    /* Without a file, a claim still excludes the other threads of the handle. */
    tc_ns* mem_ns = NULL;
    tc_claim* first = NULL;
    tc_claim* second = NULL;
    EXPECT(tc_namespace(memory, "claims", 0, &mem_ns), TC_OK);
    EXPECT(tc_claim_take(mem_ns, "k", 1, 0, &first), TC_OK);
    EXPECT(tc_claim_take(mem_ns, "k", 1, 20, &second), TC_BUSY);
    CHECK(first != NULL && second == NULL);
    EXPECT(tc_claim_take(mem_ns, "j", 1, 0, &second), TC_OK); /* another key is free */
    EXPECT(tc_claim_release(second), TC_OK);
    EXPECT(tc_claim_release(first), TC_OK);
    EXPECT(tc_claim_take(mem_ns, "k", 1, 0, &first), TC_OK);
    EXPECT(tc_claim_release(first), TC_OK);
    /* A byte key longer than TC_MAX_BYTE_KEY is refused, whatever the namespace. */
    char* huge = calloc(TC_MAX_BYTE_KEY + 1, 1);
    tc_result hr;
    memset(&hr, 0, sizeof hr);
    EXPECT(tc_get(mem_ns, huge, TC_MAX_BYTE_KEY + 1, &hr), TC_E_KEY_LEN);
    EXPECT(tc_get(mem_ns, huge, TC_MAX_BYTE_KEY, &hr), TC_MISS);
    free(huge);
  }
  EXPECT(tc_close(memory), TC_OK);

  /* Fields. */
  tc_fields* scope = tc_fields_new();
  EXPECT(tc_fields_str(scope, "device", "NVIDIA H100 80GB HBM3"), TC_OK);
  EXPECT(tc_fields_int(scope, "sm_count", 132), TC_OK);
  EXPECT(tc_fields_int(NULL, "x", 1), TC_E_NULL);
  EXPECT(tc_fields_int(scope, NULL, 1), TC_E_NULL);
  EXPECT(tc_fields_str(scope, "x", NULL), TC_E_NULL);
  EXPECT(tc_fields_json(scope, "[1, 2]"), TC_E_ARG);
  EXPECT(tc_fields_json(scope, "{\"f\": 1.5}"), TC_E_ARG);
  EXPECT(tc_fields_json(scope, "{\"n\": null}"), TC_E_ARG);
  EXPECT(tc_fields_json(scope, "{\"a\": 1, \"a\": 2}"), TC_E_ARG);
  {
    /* Deeply nested JSON is refused, not a stack overflow. */
    size_t depth = 100000;
    char* deep = malloc(2 * depth + 16);
    size_t at = 0;
    deep[at++] = '{'; memcpy(deep + at, "\"d\":", 4); at += 4;
    for (size_t i = 0; i < depth; i++) deep[at++] = '[';
    for (size_t i = 0; i < depth; i++) deep[at++] = ']';
    deep[at++] = '}'; deep[at] = 0;
    EXPECT(tc_fields_json(scope, deep), TC_E_ARG);
    free(deep);
  }
  EXPECT(tc_fields_json(scope, "{\"driver\": \"560.35.03\", \"cc\": [9, 0]}"), TC_OK);

  EXPECT(tc_open("app", 1, scope, path, &options, &cache), TC_OK);
  EXPECT(tc_mode(cache), TC_MODE_PERSISTENT);

  /* Namespaces. */
  EXPECT(tc_namespace(cache, "", sizeof key, &ns), TC_E_ARG);
  EXPECT(tc_namespace(cache, NULL, sizeof key, &ns), TC_E_NULL);
  EXPECT(tc_namespace(cache, "bad\nname", sizeof key, &ns), TC_E_ARG);
  EXPECT(tc_namespace(NULL, "matmul", sizeof key, &ns), TC_E_NULL);
  EXPECT(tc_namespace(cache, "matmul", sizeof key, NULL), TC_E_NULL);
  EXPECT(tc_namespace(cache, "matmul", sizeof key, &ns), TC_OK);
  tc_ns* again = NULL;
  EXPECT(tc_namespace(cache, "matmul", sizeof key, &again), TC_OK);
  CHECK(again == ns);

  /* Records. */
  tc_measurement m;
  memset(&m, 0, sizeof m);
  m.median_ns = 1500.0;
  m.samples = 10;
  EXPECT(tc_record(ns, &key, sizeof key - 1, "tiled", NULL, &m), TC_E_KEY_LEN);
  EXPECT(tc_record(ns, NULL, sizeof key, "tiled", NULL, &m), TC_E_NULL);
  EXPECT(tc_record(ns, &key, sizeof key, NULL, NULL, &m), TC_E_NULL);
  EXPECT(tc_record(ns, &key, sizeof key, "", NULL, &m), TC_E_ARG);
  EXPECT(tc_record(ns, &key, sizeof key, "tiled", NULL, NULL), TC_E_NULL);
  m.median_ns = NAN;
  EXPECT(tc_record(ns, &key, sizeof key, "tiled", NULL, &m), TC_E_ARG);
  m.median_ns = -1.0;
  EXPECT(tc_record(ns, &key, sizeof key, "tiled", NULL, &m), TC_E_ARG);
  m.median_ns = INFINITY;
  EXPECT(tc_record(ns, &key, sizeof key, "tiled", NULL, &m), TC_E_ARG);
  m.median_ns = 1500.0;
  /* What a shared tier's readers refuse is refused here: a fastest sample slower than the
     median, and a measurement of no samples (0 means a shipped winner). */
  m.min_ns = 1600.0;
  EXPECT(tc_record(ns, &key, sizeof key, "tiled", NULL, &m), TC_E_ARG);
  m.min_ns = 0.0;
  m.samples = 0;
  EXPECT(tc_record(ns, &key, sizeof key, "tiled", NULL, &m), TC_E_ARG);
  m.samples = 10;
  tc_fields* params = tc_fields_new();
  EXPECT(tc_fields_int(params, "tile", 128), TC_OK);
  EXPECT(tc_record(ns, &key, sizeof key, "a-rather-long-algorithm-name", params, &m), TC_OK);
  m.median_ns = 900.0;
  EXPECT(tc_record(ns, &key, sizeof key, "fast", NULL, &m), TC_OK);
  m.failed = "out of shared memory";
  EXPECT(tc_record(ns, &key, sizeof key, "broken", NULL, &m), TC_OK);

  /* Lookups. */
  tc_result r;
  memset(&r, 0, sizeof r);
  EXPECT(tc_get(ns, &key, sizeof key, NULL), TC_E_NULL);
  EXPECT(tc_get(ns, &key, 3, &r), TC_E_KEY_LEN);
  EXPECT(tc_get(NULL, &key, sizeof key, &r), TC_E_NULL);
  EXPECT(tc_get(ns, &key, sizeof key, &r), TC_OK); /* no buffers: lengths only */
  CHECK(r.algorithm_len == 4 && r.median_ns == 900.0 && r.candidates == 3 && !r.failed);
  char small[4];
  r.algorithm = small;
  r.algorithm_cap = sizeof small;
  EXPECT(tc_get(ns, &key, sizeof key, &r), TC_E_BUFFER);
  CHECK(r.algorithm_len == 4 && small[0] == 0 && r.median_ns == 900.0);
  char name[5];
  r.algorithm = name;
  r.algorithm_cap = sizeof name;
  char params_json[8];
  r.params = params_json;
  r.params_cap = sizeof params_json;
  EXPECT(tc_get(ns, &key, sizeof key, &r), TC_OK);
  CHECK(strcmp(name, "fast") == 0 && strcmp(params_json, "{}") == 0 && r.params_len == 2);
  r.algorithm = NULL;
  r.algorithm_cap = 8; /* null with a capacity */
  EXPECT(tc_get(ns, &key, sizeof key, &r), TC_E_NULL);
  struct key other = key;
  other.m = 1;
  memset(&r, 0, sizeof r);
  EXPECT(tc_get(ns, &other, sizeof other, &r), TC_MISS);

  /* Entries. */
  tc_entry* entry = NULL;
  EXPECT(tc_entry_get(ns, &key, sizeof key, &entry), TC_OK);
  CHECK(tc_entry_count(entry) == 3);
  CHECK(strlen(tc_entry_fingerprint(entry)) == 32);
  tc_candidate c;
  EXPECT(tc_entry_candidate(entry, 0, &c), TC_OK);
  CHECK(strcmp(c.algorithm, "fast") == 0 && c.failed == NULL);
  EXPECT(tc_entry_candidate(entry, 1, &c), TC_OK);
  CHECK(strcmp(c.algorithm, "a-rather-long-algorithm-name") == 0 &&
        strcmp(c.params_json, "{\"tile\":128}") == 0 && c.samples == 10);
  EXPECT(tc_entry_candidate(entry, 2, &c), TC_OK);
  CHECK(c.failed != NULL && strcmp(c.failed, "out of shared memory") == 0);
  EXPECT(tc_entry_candidate(entry, 3, &c), TC_E_ARG);
  EXPECT(tc_entry_candidate(entry, 0, NULL), TC_E_NULL);
  EXPECT(tc_entry_candidate(NULL, 0, &c), TC_E_NULL);
  CHECK(tc_entry_count(NULL) == 0 && tc_entry_fingerprint(NULL) == NULL);
  tc_entry_free(entry);
  tc_entry_free(NULL);
  EXPECT(tc_entry_get(ns, &other, sizeof other, &entry), TC_MISS);
  CHECK(entry == NULL);

  /* Typed keys. */
  tc_fields* typed = tc_fields_new();
  EXPECT(tc_fields_json(typed, "{\"m\":128,\"n\":256,\"k\":64,\"dtype\":\"float16\"}"), TC_OK);
  tc_ns* any = NULL;
  EXPECT(tc_namespace(cache, "matmul", 0, &any), TC_OK);
  CHECK(any != ns);
  m.failed = NULL;
  EXPECT(tc_record_fields(any, typed, "tiled", params, &m), TC_OK);
  memset(&r, 0, sizeof r);
  EXPECT(tc_get_fields(any, typed, &r), TC_OK);
  EXPECT(tc_get_fields(any, NULL, &r), TC_E_NULL);
  EXPECT(tc_get(any, "", 0, &r), TC_MISS); /* an empty byte key, allowed without a size */

  /* Claims. */
  tc_claim* claim = NULL;
  EXPECT(tc_claim_take(ns, &key, sizeof key, 0, NULL), TC_E_NULL);
  EXPECT(tc_claim_take(ns, &key, sizeof key, 0, &claim), TC_OK);
  CHECK(claim != NULL);
  EXPECT(tc_claim_release(claim), TC_OK);
  EXPECT(tc_claim_release(NULL), TC_OK);

  /* The last error: truncated copies, and the full length. */
  EXPECT(tc_get(ns, &key, 1, &r), TC_E_KEY_LEN);
  char tiny[8];
  size_t full = tc_last_error(tiny, sizeof tiny);
  CHECK(full > sizeof tiny && strlen(tiny) == sizeof tiny - 1);
  CHECK(tc_last_error(tiny, 0) == full);

  EXPECT(tc_flush(cache, 5000), TC_OK);
  size_t len = 0;
  EXPECT(tc_len(cache, &len), TC_OK);
  CHECK(len == 2);
  EXPECT(tc_len(cache, NULL), TC_E_NULL);

  /* After close: every call says so. */
  EXPECT(tc_close(cache), TC_OK);
  EXPECT(tc_close(cache), TC_OK);
  EXPECT(tc_get(ns, &key, sizeof key, &r), TC_E_CLOSED);
  EXPECT(tc_record(ns, &key, sizeof key, "tiled", NULL, &m), TC_E_CLOSED);
  EXPECT(tc_claim_take(ns, &key, sizeof key, 0, &claim), TC_E_CLOSED);
  EXPECT(tc_entry_get(ns, &key, sizeof key, &entry), TC_E_CLOSED);
  EXPECT(tc_namespace(cache, "matmul", sizeof key, &ns), TC_E_CLOSED);
  EXPECT(tc_flush(cache, 0), TC_E_CLOSED);
  EXPECT(tc_refresh(cache), TC_E_CLOSED);
  EXPECT(tc_mode(cache), TC_E_CLOSED);
  EXPECT(tc_flush(NULL, 0), TC_E_NULL);
  EXPECT(tc_close(NULL), TC_E_NULL);

  /* Scopes: another cuDNN version in the same file never sees these results; the same
   * scope does. */
  {
    tc_fields* newer = tc_fields_new();
    EXPECT(tc_fields_json(newer, "{\"device\": \"NVIDIA H100 80GB HBM3\", \"sm_count\": 132, "
                                 "\"driver\": \"560.35.03\", \"cc\": [9, 0], \"cudnn\": 90200}"),
           TC_OK);
    tc_cache* other = NULL;
    tc_ns* other_ns = NULL;
    EXPECT(tc_open("app", 1, newer, path, NULL, &other), TC_OK);
    EXPECT(tc_namespace(other, "matmul", sizeof key, &other_ns), TC_OK);
    memset(&r, 0, sizeof r);
    EXPECT(tc_get(other_ns, &key, sizeof key, &r), TC_MISS);
    EXPECT(tc_close(other), TC_OK);
    EXPECT(tc_open("app", 1, scope, path, NULL, &other), TC_OK);
    EXPECT(tc_namespace(other, "matmul", sizeof key, &other_ns), TC_OK);
    EXPECT(tc_get(other_ns, &key, sizeof key, &r), TC_OK);
    EXPECT(tc_close(other), TC_OK);
    tc_fields_free(newer);
  }

  tc_fields_free(typed);
  tc_fields_free(params);
  tc_fields_free(scope);
  tc_fields_free(NULL);
  if (failures) {
    fprintf(stderr, "bad_input: %d failures\n", failures);
    return 1;
  }
  printf("bad_input: ok\n");
  return 0;
}
