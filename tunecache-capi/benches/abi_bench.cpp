// The C ABI's cost against what ATen does today, in one process and one run:
//   - a lookup hit: std::unordered_map + std::mutex with ATen's byte-wise FNV hash and memcmp
//     (the seed's BenchmarkCache::find) against tunecache's tc_get of the same POD key, through
//     the C++ wrapper (BenchmarkCache::find, Namespace::find) and raw;
//   - a record: the map's insert against tc_record (memory; saved by the background saver), and
//     a file per key written durably (Inductor's way, fsynced) against tc_record + tc_flush
//     (durable on return).
// Usage: abi_bench FILE. Prints one line per measurement: name, ns per operation (median of 7
// rounds), and the ratio to the baseline.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "tunecache.hpp"

namespace {

struct ConvolutionParams {  // ATen's shape, ~100 bytes
  int device_id;
  int dataType;
  int input_size[5];
  int input_stride[5];
  int weight_size[5];
  int padding[3];
  int stride[3];
  int dilation[3];
  int64_t groups;
  bool deterministic;
  bool allow_tf32;
};

struct AlgoPerf {
  int algo;
  int status;
  float time;
  size_t memory;
  int determinism;
  int mathType;
};

// ATen's ParamsHash and ParamsEqual (aten/src/ATen/native/utils/ParamsHash.h).
struct ParamsHash {
  size_t operator()(const ConvolutionParams& p) const {
    auto ptr = reinterpret_cast<const uint8_t*>(&p);
    uint32_t value = 0x811C9DC5;
    for (size_t i = 0; i < sizeof p; ++i) {
      value ^= ptr[i];
      value *= 0x01000193;
    }
    return value;
  }
};
struct ParamsEqual {
  bool operator()(const ConvolutionParams& a, const ConvolutionParams& b) const {
    return std::memcmp(&a, &b, sizeof a) == 0;
  }
};

// The seed's BenchmarkCache<T>.
struct AtenCache {
  std::mutex mutex;
  std::unordered_map<ConvolutionParams, AlgoPerf, ParamsHash, ParamsEqual> map;
  bool find(const ConvolutionParams& params, AlgoPerf* results) {
    std::lock_guard<std::mutex> guard(mutex);
    auto it = map.find(params);
    if (it == map.end()) return false;
    *results = it->second;
    return true;
  }
  void insert(const ConvolutionParams& params, const AlgoPerf& results) {
    std::lock_guard<std::mutex> guard(mutex);
    map[params] = results;
  }
};

constexpr int kKeys = 256;

ConvolutionParams key_of(int k) {
  ConvolutionParams p;
  std::memset(&p, 0, sizeof p);
  p.dataType = 2;
  p.input_size[0] = 1 + k % 32;
  p.input_size[1] = 64 << (k / 32 % 4);
  p.input_size[2] = p.input_size[3] = 56 >> (k / 128);
  p.weight_size[0] = 64;
  p.weight_size[1] = p.input_size[1];
  p.weight_size[2] = p.weight_size[3] = 3;
  p.padding[0] = p.padding[1] = p.stride[0] = p.stride[1] = p.dilation[0] = p.dilation[1] = 1;
  p.groups = 1;
  p.allow_tf32 = true;
  return p;
}

AlgoPerf perf_of(int k) {
  AlgoPerf perf;
  std::memset(&perf, 0, sizeof perf);
  perf.algo = k % 7;
  perf.time = 0.25f + 0.001f * static_cast<float>(k);
  // The workspace is the key's and the algorithm's; only the time differs between
  // measurements (call i is for key i % kKeys). It once grew with i, so every record made a
  // new candidate and the entries, written whole, grew through the run.
  perf.memory = static_cast<size_t>(k % kKeys) << 10;
  return perf;
}

volatile int sink;

// ns per call of `op(i)`, the median of 7 rounds of `n` calls.
template <class F>
double time_ns(int n, F op) {
  std::vector<double> rounds;
  for (int r = 0; r < 7; ++r) {
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) op(i);
    std::chrono::duration<double, std::nano> took = std::chrono::steady_clock::now() - start;
    rounds.push_back(took.count() / n);
  }
  std::sort(rounds.begin(), rounds.end());
  return rounds[rounds.size() / 2];
}

void report(const char* name, double ns, double baseline) {
  std::printf("%-58s %10.1f ns  %6.2fx\n", name, ns, ns / baseline);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  std::vector<ConvolutionParams> keys;
  for (int k = 0; k < kKeys; ++k) keys.push_back(key_of(k));

  AtenCache aten;
  tunecache::Fields scope;
  scope.set("device", "bench");
  tunecache::Cache cache("abi-bench", 1, &scope, argv[1]);
  tunecache::BenchmarkCache<ConvolutionParams, AlgoPerf> tc(cache, "conv_fwd");
  for (int k = 0; k < kKeys; ++k) {
    aten.insert(keys[k], perf_of(k));
    tc.insert(keys[k], perf_of(k));
  }
  cache.flush();
  const int n = 200000;
  std::printf("sizeof(ConvolutionParams) = %zu bytes, %d keys, %d lookups per round\n",
              sizeof(ConvolutionParams), kKeys, n);

  double base = time_ns(n, [&](int i) {
    AlgoPerf perf;
    sink = aten.find(keys[i % kKeys], &perf) ? perf.algo : -1;
  });
  report("hit: unordered_map + mutex (ATen's BenchmarkCache::find)", base, base);
  report("hit: tunecache::BenchmarkCache::find (tc_get + the POD)", time_ns(n, [&](int i) {
           AlgoPerf perf;
           sink = tc.find(keys[i % kKeys], &perf) ? perf.algo : -1;
         }), base);
  auto ns = tc.ns();
  report("hit: tunecache::Namespace::find (winner's name)", time_ns(n, [&](int i) {
           auto w = ns.find(keys[i % kKeys]);
           sink = w ? static_cast<int>(w->algorithm.size()) : -1;
         }), base);
  report("hit: tc_get, stats only (C)", time_ns(n, [&](int i) {
           tc_result r{};
           sink = tc_get(ns.get(), &keys[i % kKeys], sizeof(ConvolutionParams), &r);
         }), base);

  const int writes = 2000;
  double ins = time_ns(writes, [&](int i) { aten.insert(keys[i % kKeys], perf_of(i)); });
  report("insert: unordered_map + mutex", ins, ins);
  report("record: tc_record (memory; saved in the background)", time_ns(writes, [&](int i) {
           tc.insert(keys[i % kKeys], perf_of(i));
         }), ins);
  // Durable: against a file per key written as Inductor's caches write theirs, made durable
  // (a temporary file written, fsynced and renamed over the key's file), on the same disk.
  std::string dir(argv[1]);
  dir = dir.substr(0, dir.find_last_of('/') + 1);
  double per_key = time_ns(200, [&](int i) {
    char value[320];
    std::snprintf(value, sizeof value, "{\"algo\": %d, \"time\": %d, \"memory\": 0}", i, i);
    std::string target = dir + "k" + std::to_string(i % kKeys) + ".json";
    std::string tmp = target + ".tmp";
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || ::write(fd, value, std::strlen(value)) < 0 || ::fsync(fd) != 0) std::abort();
    ::close(fd);
    if (std::rename(tmp.c_str(), target.c_str()) != 0) std::abort();
  });
  report("durable: a file per key, written, fsynced and renamed", per_key, per_key);
  report("record + flush: tc_record then tc_flush (durable)", time_ns(200, [&](int i) {
           tc.insert(keys[i % kKeys], perf_of(i + 7));
           cache.flush();
         }), per_key);
  return 0;
}
