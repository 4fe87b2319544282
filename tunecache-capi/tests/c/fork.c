/* fork() from a threaded process: while a thread records and flushes without pause, the main
 * thread forks 20 children. Each child finds the inherited handle closed (TC_E_CLOSED), closes
 * it without waiting for a saver it does not have, opens its own on the same file, records one
 * key and saves it. Nothing hangs (alarm) and every record of parent and children is there.
 * A claim held across a fork stays the parent's: the child's release of its copy unlocks
 * nothing, and the child keeps no descriptor of the claim file open. */
#define _DEFAULT_SOURCE
#include <dirent.h>
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

/* Whether this process has a claim file open. */
static int claim_file_open(void) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == NULL) return 1;
  int found = 0;
  struct dirent* e;
  while ((e = readdir(dir)) != NULL) {
    char link[300], target[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n > 0) {
      target[n] = 0;
      if (strstr(target, ".claims/") != NULL) found = 1;
    }
  }
  closedir(dir);
  return found;
}

static int claim_child(tc_claim* inherited, int key) {
  alarm(30);
  if (tc_claim_release(inherited) != TC_OK) return 20;
  if (claim_file_open()) return 21;
  tc_cache* own = NULL;
  tc_ns* own_ns = NULL;
  tc_claim* mine = NULL;
  if (tc_open("fork-test", 1, NULL, path, NULL, &own) != TC_OK) return 22;
  if (tc_namespace(own, "n", sizeof(int), &own_ns) != TC_OK) return 22;
  /* The parent still holds the key. */
  if (tc_claim_take(own_ns, &key, sizeof key, 0, &mine) != TC_BUSY) return 23;
  return tc_close(own) == TC_OK ? 0 : 24;
}

/* A claim held while forking: returns 0 when the child behaves. */
static int claim_across_fork(void) {
  int key = 424242;
  tc_claim* claim = NULL;
  if (tc_claim_take(ns, &key, sizeof key, 0, &claim) != TC_OK) return 30;
  pid_t pid = fork();
  if (pid == 0) _exit(claim_child(claim, key));
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "the claim child failed: status %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return 31;
  }
  if (tc_claim_release(claim) != TC_OK) return 32;
  if (tc_claim_take(ns, &key, sizeof key, 0, &claim) != TC_OK) return 33;
  return tc_claim_release(claim) == TC_OK ? 0 : 34;
}

int main(int argc, char** argv) {
  path = argc > 1 ? argv[1] : "fork.tcache";
  alarm(120);
  tc_cache* cache = NULL;
  if (tc_open("fork-test", 1, NULL, path, NULL, &cache) != TC_OK) return 2;
  if (tc_namespace(cache, "n", sizeof(int), &ns) != TC_OK) return 2;
  int claimed = claim_across_fork();
  if (claimed != 0) {
    fprintf(stderr, "a claim across a fork: failure %d\n", claimed);
    return 1;
  }
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
