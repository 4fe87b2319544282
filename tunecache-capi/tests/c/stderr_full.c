/* A process whose stderr cannot be written (a full disk; run with stderr on /dev/full): the
 * library's warnings are lost, never fatal. Found by a hostile review: the saver thread's first
 * warning made the log writer report its own failure with a print that panics, the saver died,
 * and every later flush timed out. Here a journal record is damaged so the saver warns, and
 * every flush after it must still succeed. */
#include <stdio.h>
#include <string.h>

#include "tunecache.h"

static int record(tc_ns* ns, int key) {
  tc_measurement m;
  memset(&m, 0, sizeof m);
  m.median_ns = 1000.0 + key;
  m.samples = 1;
  return tc_record(ns, &key, sizeof key, "algo", NULL, &m);
}

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  tc_cache* cache = NULL;
  tc_ns* ns = NULL;
  if (tc_open("stderr-test", 1, NULL, argv[1], NULL, &cache) != TC_OK) return 3;
  if (tc_namespace(cache, "n", sizeof(int), &ns) != TC_OK) return 4;
  /* The first save writes the table, the second appends to the journal. */
  for (int k = 0; k < 2; k++) {
    if (record(ns, k) != TC_OK || tc_flush(cache, 0) != TC_OK) return 5;
  }
  char journal[4096];
  snprintf(journal, sizeof journal, "%s.journal", argv[1]);
  FILE* f = fopen(journal, "r+b");
  if (f == NULL || fseek(f, -12, SEEK_END) != 0) return 6;
  int byte = fgetc(f);
  if (byte == EOF || fseek(f, -12, SEEK_END) != 0 || fputc(byte ^ 0x5a, f) == EOF) return 7;
  if (fclose(f) != 0) return 8;
  /* The saver warns (damage, a journal that lost this process's record) and goes on. */
  for (int k = 2; k < 5; k++) {
    if (record(ns, k) != TC_OK) return 9;
    int flushed = tc_flush(cache, 0);
    if (flushed != TC_OK) {
      printf("flush %d failed: %d\n", k, flushed);
      return 10;
    }
  }
  if (tc_close(cache) != TC_OK) return 11;
  printf("every flush succeeded\n");
  return 0;
}
