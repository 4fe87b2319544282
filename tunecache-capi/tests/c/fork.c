/* fork() from a threaded process: while a thread records and flushes without pause, the main
 * thread forks 20 children. Each child finds the inherited handle closed (TC_E_CLOSED), closes
 * it without waiting for a saver it does not have, opens its own on the same file, records one
 * key and saves it. Nothing hangs (alarm) and every record of parent and children is there. */
#define _DEFAULT_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tunecache.h"

static const char* path;
static tc_ns* ns;
static atomic_int stop;
static atomic_int recorded;

static int record(tc_ns* where, int key, double ns_time) {
  tc_measurement m;
  memset(&m, 0, sizeof m);
  m.median_ns = ns_time;
  m.samples = 1;
  return tc_record(where, &key, sizeof key, "algo", NULL, &m);
}

static void* recorder(void* cache) {
  for (int k = 0; !atomic_load(&stop); k++) {
    if (record(ns, k, 1000.0 + k) != TC_OK) return (void*)1;
    if (k % 10 == 9 && tc_flush(cache, 0) != TC_OK) return (void*)1;
    atomic_store(&recorded, k + 1);
  }
  return NULL;
}

static int child(tc_cache* inherited, int round) {
  alarm(30);
  tc_result r;
  memset(&r, 0, sizeof r);
  int key = 0;
  if (tc_get(ns, &key, sizeof key, &r) != TC_E_CLOSED) return 10;
  if (tc_close(inherited) != TC_OK) return 11;
  tc_cache* own = NULL;
  tc_ns* own_ns = NULL;
  if (tc_open("fork-test", 1, NULL, path, NULL, &own) != TC_OK) return 12;
  if (tc_namespace(own, "n", sizeof(int), &own_ns) != TC_OK) return 13;
  if (record(own_ns, 100000 + round, 7.0) != TC_OK) return 14;
  if (tc_close(own) != TC_OK) return 15;
  return 0;
}

int main(int argc, char** argv) {
  path = argc > 1 ? argv[1] : "fork.tcache";
  alarm(120);
  tc_cache* cache = NULL;
  if (tc_open("fork-test", 1, NULL, path, NULL, &cache) != TC_OK) return 2;
  if (tc_namespace(cache, "n", sizeof(int), &ns) != TC_OK) return 2;
  pthread_t thread;
  pthread_create(&thread, NULL, recorder, cache);
  for (int round = 0; round < 20; round++) {
    while (atomic_load(&recorded) < 10 * (round + 1)) usleep(100);
    pid_t pid = fork();
    if (pid == 0) _exit(child(cache, round));
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "child %d failed: status %d\n", round, status);
      return 1;
    }
  }
  atomic_store(&stop, 1);
  void* failed = NULL;
  pthread_join(thread, &failed);
  if (failed) {
    char msg[256];
    tc_last_error(msg, sizeof msg);
    fprintf(stderr, "the recorder failed: %s\n", msg);
    return 1;
  }
  int total = atomic_load(&recorded);
  if (tc_close(cache) != TC_OK) return 3;

  /* Everything is there: the parent's records and each child's. */
  if (tc_open("fork-test", 1, NULL, path, NULL, &cache) != TC_OK) return 4;
  if (tc_namespace(cache, "n", sizeof(int), &ns) != TC_OK) return 4;
  int missing = 0;
  tc_result r;
  for (int k = 0; k < total; k++) {
    memset(&r, 0, sizeof r);
    if (tc_get(ns, &k, sizeof k, &r) != TC_OK || r.median_ns != 1000.0 + k) missing++;
  }
  for (int round = 0; round < 20; round++) {
    int k = 100000 + round;
    memset(&r, 0, sizeof r);
    if (tc_get(ns, &k, sizeof k, &r) != TC_OK) missing++;
  }
  tc_close(cache);
  if (missing) {
    fprintf(stderr, "%d records missing\n", missing);
    return 1;
  }
  printf("fork: 20 children, %d parent records, nothing missing\n", total);
  return 0;
}
