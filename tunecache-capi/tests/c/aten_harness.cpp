// A harness that uses tunecache as ATen uses its cuDNN BenchmarkCache: a POD key of about
// twenty fields, memset then filled, looked up and inserted by many threads at once.
//
//   aten_harness write  FILE          8 threads x 10,000 find/insert on 256 shared keys, then
//                                     flush; exits 0 when every record reads back in-process
//   aten_harness read   FILE          a second process: every (key, thread) record is there
//   aten_harness claims FILE LOG      8 threads race to tune 64 keys (claim, look again,
//                                     measure, record); each measurement appends a line to LOG
//   aten_harness killable FILE        records key after key, printing "acked N" after each
//                                     flush that covered keys 0..N, until killed
//   aten_harness acked FILE N         keys 0..N are all there
//   aten_harness fingerprint FILE K   prints key K's bytes (hex) and its fingerprint
// Prints what failed and exits 1 on any difference.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tunecache.hpp"

namespace {

// The shape of ATen's ConvolutionParams (aten/src/ATen/native/cudnn/ConvShared.h), widened.
struct ConvolutionParams {
  int device_id;
  int dataType;
  int input_size[5];
  int input_stride[5];
  int weight_size[5];
  int padding[3];
  int stride[3];
  int dilation[3];
  int output_padding[3];
  int64_t groups;
  int memory_format;
  int input_dim;
  bool deterministic;
  bool allow_tf32;
  bool transposed;
  bool benchmark;
  int64_t workspace_limit;
  int math_type;
};

// The shape of cudnnConvolutionFwdAlgoPerf_t.
struct AlgoPerf {
  int algo;
  int status;
  float time;  // milliseconds
  size_t memory;
  int determinism;
  int mathType;
};

constexpr int kThreads = 8;
constexpr int kOps = 10000;
constexpr int kKeys = 256;

ConvolutionParams key_of(int k) {
  ConvolutionParams p;
  std::memset(&p, 0, sizeof p);  // as ATen does: the padding bytes are part of the key
  p.device_id = 0;
  p.dataType = 2;
  p.input_dim = 4;
  int dims[5] = {1 + k % 8, 64 + (k / 8) % 4 * 32, 56 >> (k / 32 % 4), 56 >> (k / 32 % 4), 0};
  for (int i = 0; i < 4; ++i) p.input_size[i] = dims[i];
  p.input_stride[3] = 1;
  p.input_stride[2] = dims[3];
  p.input_stride[1] = dims[2] * dims[3];
  p.input_stride[0] = dims[1] * dims[2] * dims[3];
  p.weight_size[0] = 64 + k % 3 * 64;
  p.weight_size[1] = dims[1];
  p.weight_size[2] = p.weight_size[3] = 3;
  for (int i = 0; i < 2; ++i) p.padding[i] = p.stride[i] = p.dilation[i] = 1;
  p.groups = 1 + (k >> 7);
  p.memory_format = k % 2;
  p.allow_tf32 = true;
  p.benchmark = true;
  p.workspace_limit = int64_t{1} << 30;
  p.math_type = 1;
  return p;
}

float time_of(int thread, int k) { return 0.5f + 0.01f * static_cast<float>(thread) + 0.001f * static_cast<float>(k % 13); }

AlgoPerf perf_of(int thread, int k) {
  AlgoPerf perf;
  std::memset(&perf, 0, sizeof perf);
  perf.algo = thread;
  perf.time = time_of(thread, k);
  perf.memory = static_cast<size_t>(k) * 1024;
  perf.mathType = 1;
  return perf;
}

using Cache = tunecache::BenchmarkCache<ConvolutionParams, AlgoPerf>;

tunecache::Fields scope() {
  tunecache::Fields s;
  s.set("device", "NVIDIA H100 80GB HBM3").set("cudnn", 90100).set("sm_count", 132).set("driver", "560.35.03");
  return s;
}

std::atomic<int> failures{0};

void expect(bool ok, const std::string& what) {
  if (!ok) {
    if (failures.fetch_add(1) < 20) std::fprintf(stderr, "FAIL: %s\n", what.c_str());
  }
}

// Every key holds one candidate per thread, with that thread's time; the winner is thread 0's.
void check_all(const Cache& cache, const char* who) {
  for (int k = 0; k < kKeys; ++k) {
    auto key = key_of(k);
    auto cands = cache.ns().candidates(key);
    expect(cands.size() == kThreads, std::string(who) + ": key " + std::to_string(k) + " has " +
                                         std::to_string(cands.size()) + " candidates");
    for (int t = 0; t < kThreads; ++t) {
      bool found = false;
      for (const auto& c : cands) {
        if (c.algorithm == "algo=" + std::to_string(t)) {
          found = c.median_ns == static_cast<double>(time_of(t, k)) * 1e6;
        }
      }
      expect(found, std::string(who) + ": key " + std::to_string(k) + " lost thread " + std::to_string(t));
    }
    AlgoPerf best;
    expect(cache.find(key, &best) && best.algo == 0 && best.time == time_of(0, k) &&
               best.memory == static_cast<size_t>(k) * 1024,
           std::string(who) + ": key " + std::to_string(k) + " has the wrong winner");
  }
}

int write(const char* path) {
  auto s = scope();
  tunecache::Cache tc("aten-harness", 1, &s, path);
  Cache cache(tc, "conv_fwd");
  std::atomic<long> hits{0}, inserts{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kOps; ++i) {
        if (i % 2 == 0) {
          AlgoPerf perf;
          if (cache.find(key_of((i * 31 + t * 17) % kKeys), &perf)) hits.fetch_add(1);
        } else {
          int k = (i / 2 + t * 17) % kKeys;
          cache.insert(key_of(k), perf_of(t, k));
          inserts.fetch_add(1);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  check_all(cache, "in-process");
  tc.flush();
  expect(tc.mode() == TC_MODE_PERSISTENT, "the cache is not persistent");
  expect(tc.size() == kKeys, "the cache holds " + std::to_string(tc.size()) + " entries");
  std::printf("write: %d threads x %d ops: %ld inserts, %ld hits, %zu keys\n", kThreads, kOps,
              inserts.load(), hits.load(), tc.size());
  return failures.load() ? 1 : 0;
}

int read(const char* path) {
  auto s = scope();
  tunecache::Cache tc("aten-harness", 1, &s, path);
  Cache cache(tc, "conv_fwd");
  check_all(cache, "second process");
  std::printf("read: %zu keys, every record there\n", tc.size());
  return failures.load() ? 1 : 0;
}

// ATen measures again when its cache misses, and the times differ each time: a re-measured
// algorithm replaces its time and is not a new candidate (the time was once part of the
// candidate's params, so every re-measurement added one and an entry grew without bound).
int remeasure(const char* path) {
  auto s = scope();
  tunecache::Cache tc("aten-harness", 1, &s, path);
  Cache cache(tc, "conv_remeasured");
  auto key = key_of(7);
  AlgoPerf perf = perf_of(0, 7);
  for (int i = 0; i < 1000; ++i) {
    perf.algo = i % 2;
    perf.time = 2.0f - 0.001f * static_cast<float>(i);  // later is faster: both rules agree
    cache.insert(key, perf);
  }
  auto cands = cache.ns().candidates(key);
  expect(cands.size() == 2, "re-measured: " + std::to_string(cands.size()) + " candidates");
  AlgoPerf best;
  expect(cache.find(key, &best) && best.algo == 1 && best.time == perf.time &&
             best.memory == perf.memory,
         "re-measured: the winner is not the last measurement");
  // Slower, a few milliseconds later: the last time is taken (within one millisecond the
  // merge rule keeps the lower median).
  for (float t : {3.0f, 4.0f, 3.5f}) {
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    perf.time = t;
    cache.insert(key, perf);
  }
  double algo1 = 0;
  for (const auto& c : cache.ns().candidates(key))
    if (c.algorithm == "algo=1") algo1 = c.median_ns;
  expect(algo1 == 3.5e6, "re-measured slower: algo=1 holds " + std::to_string(algo1) + " ns");
  tc.flush();
  std::printf("remeasure: %zu candidates\n", cands.size());
  return failures.load() ? 1 : 0;
}

// A cache written before the time left the pod: each measurement of an algorithm was a
// candidate of its own, its time in its params (100 of algo 1 here: more than a find once
// went through one at a time). find() serves each algorithm's latest result (here slower
// than the old ones), and an algorithm never measured again keeps its latest old result.
int old_layout(const char* path) {
  auto s = scope();
  tunecache::Cache tc("aten-harness", 1, &s, path);
  Cache cache(tc, "conv_old_layout");
  auto key = key_of(9);
  AlgoPerf perf = perf_of(0, 9);
  auto record_old = [&](int algo, float time) {  // as the earlier tunecache.hpp did
    perf.algo = algo;
    perf.time = time;
    tunecache::Fields params;
    params.set("pod", tunecache::detail::hex_of(&perf, sizeof perf));
    tunecache::Measurement m;
    m.median_ns = static_cast<double>(time) * 1e6;
    cache.ns().record(key, "algo=" + std::to_string(algo), m, &params);
  };
  for (int i = 0; i < 100; ++i) record_old(1, 0.25f + 0.001f * static_cast<float>(i));
  record_old(2, 0.6f);
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  record_old(2, 0.75f);  // algo 2's latest old result: the one brought over
  perf.algo = 1;
  perf.time = 0.9f;  // algo 1 measured again, slower: algo 2's old result now wins
  cache.insert(key, perf);
  AlgoPerf best;
  expect(cache.find(key, &best) && best.algo == 2 && best.time == 0.75f,
         "old layout: the winner is not algo 2's 0.75 ms");
  perf.algo = 2;
  perf.time = 1.5f;  // and algo 2 too: algo 1's 0.9 wins
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  cache.insert(key, perf);
  expect(cache.find(key, &best) && best.algo == 1 && best.time == 0.9f,
         "old layout: the winner is not algo 1's 0.9 ms");
  int live = 0;
  for (const auto& c : cache.ns().candidates(key)) live += !c.failure;
  expect(live == 2, "old layout: " + std::to_string(live) + " candidates not superseded");
  tc.flush();
  std::printf("old layout: served the latest results\n");
  return failures.load() ? 1 : 0;
}

// One tuner per key: a thread that misses takes the key's claim, looks again, and measures
// only if the key is still missing. Each measurement appends one line to the log.
int claims(const char* path, const char* log) {
  auto s = scope();
  tunecache::Cache tc("aten-harness", 1, &s, path);
  auto ns = tc.ns<ConvolutionParams>("conv_claims");
  int fd = ::open(log, O_WRONLY | O_APPEND | O_CREAT, 0644);
  if (fd < 0) return 2;
  std::atomic<int> measured{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 64; ++i) {
        int k = (i + t * 8) % 64;
        auto key = key_of(k);
        if (ns.find(key)) continue;
        auto claim = ns.claim(key, std::chrono::seconds(30));
        expect(static_cast<bool>(claim), "a claim was busy for 30 s");
        if (ns.find(key)) continue;  // the holder recorded it while we waited
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        std::string line = std::to_string(k) + "\n";
        expect(::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()), "log write");
        ns.record(key, "algo=" + std::to_string(t), {1000.0 + t});
        measured.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  tc.flush();
  ::close(fd);
  std::printf("claims: measured %d keys\n", measured.load());
  return failures.load() ? 1 : 0;
}

int killable(const char* path) {
  auto s = scope();
  tunecache::Cache tc("aten-harness", 1, &s, path);
  auto ns = tc.ns<ConvolutionParams>("conv_killed");
  for (int n = 0;; ++n) {
    ns.record(key_of(n), "algo=" + std::to_string(n % 5), {1000.0 + n});
    if (n % 10 == 9) {
      tc.flush();
      std::printf("acked %d\n", n);
      std::fflush(stdout);
    }
  }
}

int acked(const char* path, int n) {
  auto s = scope();
  tunecache::Cache tc("aten-harness", 1, &s, path);
  auto ns = tc.ns<ConvolutionParams>("conv_killed");
  for (int k = 0; k <= n; ++k) {
    auto hit = ns.find(key_of(k));
    expect(hit && hit->algorithm == "algo=" + std::to_string(k % 5) && hit->median_ns == 1000.0 + k,
           "acknowledged key " + std::to_string(k) + " lost");
  }
  std::printf("acked: keys 0..%d all there\n", n);
  return failures.load() ? 1 : 0;
}

// Prints key k's bytes in hex and the fingerprint tunecache gives it.
int fingerprint(const char* path, int k) {
  auto s = scope();
  tunecache::Cache tc("aten-harness", 1, &s, path);
  auto ns = tc.ns<ConvolutionParams>("conv_fwd");
  auto key = key_of(k);
  tc_entry* entry = nullptr;
  if (tunecache::detail::check(tc_entry_get(ns.get(), &key, sizeof key, &entry)) != TC_OK) return 1;
  std::printf("%s %s\n", tunecache::detail::hex_of(&key, sizeof key).c_str(), tc_entry_fingerprint(entry));
  tc_entry_free(entry);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string mode = argc > 2 ? argv[1] : "";
    if (mode == "write") return write(argv[2]);
    if (mode == "read") return read(argv[2]);
    if (mode == "remeasure") return remeasure(argv[2]);
    if (mode == "old-layout") return old_layout(argv[2]);
    if (mode == "claims" && argc > 3) return claims(argv[2], argv[3]);
    if (mode == "killable") return killable(argv[2]);
    if (mode == "fingerprint" && argc > 3) return fingerprint(argv[2], std::atoi(argv[3]));
    if (mode == "acked" && argc > 3) return acked(argv[2], std::atoi(argv[3]));
  } catch (const tunecache::error& e) {
    std::fprintf(stderr, "tunecache error %d: %s\n", e.code(), e.what());
    return 1;
  }
  std::fprintf(stderr, "usage: aten_harness write|read|remeasure|old-layout|killable FILE | claims FILE LOG | acked FILE N\n");
  return 2;
}
