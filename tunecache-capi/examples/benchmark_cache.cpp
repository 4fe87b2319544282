// ATen's cuDNN benchmark cache, persisted by tunecache with three lines changed.
//
// Before (aten/src/ATen/native/cudnn/Conv_v7.cpp): a map in memory, lost at exit.
//
//   template <typename T> struct BenchmarkCache {
//     std::mutex mutex;
//     std::unordered_map<ConvolutionParams, T, ParamsHash<ConvolutionParams>,
//                        ParamsEqual<ConvolutionParams>> map;
//     bool find(const ConvolutionParams& params, T* results);
//     void insert(const ConvolutionParams& params, const T& results);
//   };
//   BenchmarkCache<cudnnConvolutionFwdAlgoPerf_t> fwd_algos;
//
// After: the same find/insert calls, kept in a file every process and thread shares, scoped
// to the device and library versions so results never cross them.
//
//   #include "tunecache.hpp"                                                   // 1
//   tunecache::Cache tuned("aten-cudnn", 1, &scope);                           // 2
//   tunecache::BenchmarkCache<ConvolutionParams, cudnnConvolutionFwdAlgoPerf_t>
//       fwd_algos(tuned, "conv_fwd");                                          // 3
//
// Build: c++ -std=c++17 benchmark_cache.cpp $(pkg-config --cflags --libs tunecache)
// Run it twice: the second run benchmarks nothing.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "tunecache.hpp"  // 1

// Stand-ins for ATen's key and cuDNN's result struct (the real ones work the same way).
struct ConvolutionParams {
  int device_id;
  int dataType;
  int input_size[5];
  int weight_size[5];
  int padding[3];
  int stride[3];
  int dilation[3];
  int64_t groups;
  bool deterministic;
  bool allow_tf32;
};

struct cudnnConvolutionFwdAlgoPerf_t {
  int algo;
  int status;
  float time;  // milliseconds
  size_t memory;
  int determinism;
  int mathType;
};

// What ATen does on a miss: run every algorithm and keep the fastest (here: a model of it).
static cudnnConvolutionFwdAlgoPerf_t benchmark(const ConvolutionParams& p) {
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  cudnnConvolutionFwdAlgoPerf_t best{};
  for (int algo = 0; algo < 8; ++algo) {
    float time = 0.1f + 0.01f * static_cast<float>((algo * 7 + p.input_size[0]) % 8);
    if (algo == 0 || time < best.time) {
      best.algo = algo;
      best.time = time;
      best.memory = static_cast<size_t>(algo) << 20;
    }
  }
  return best;
}

int main(int argc, char** argv) {
  tunecache::Fields scope;
  scope.set("device", "NVIDIA H100 80GB HBM3").set("cudnn", 90100).set("driver", "560.35.03");
  const char* path = argc > 1 ? argv[1] : nullptr;  // null: the user cache directory

  tunecache::Cache tuned("aten-cudnn", 1, &scope, path);                          // 2
  tunecache::BenchmarkCache<ConvolutionParams, cudnnConvolutionFwdAlgoPerf_t> fwd_algos(
      tuned, "conv_fwd");                                                          // 3

  int benchmarked = 0;
  for (int batch : {1, 8, 32}) {
    ConvolutionParams params;
    std::memset(&params, 0, sizeof params);  // as ATen does: padding bytes are part of the key
    int input[5] = {batch, 64, 56, 56, 0};
    int weight[5] = {64, 64, 3, 3, 0};
    std::memcpy(params.input_size, input, sizeof input);
    std::memcpy(params.weight_size, weight, sizeof weight);
    params.padding[0] = params.padding[1] = 1;
    params.stride[0] = params.stride[1] = params.dilation[0] = params.dilation[1] = 1;
    params.groups = 1;

    cudnnConvolutionFwdAlgoPerf_t perf;
    if (!fwd_algos.find(params, &perf)) {
      perf = benchmark(params);
      fwd_algos.insert(params, perf);
      ++benchmarked;
    }
    std::printf("batch %2d: algo %d, %.3f ms\n", batch, perf.algo, static_cast<double>(perf.time));
  }
  std::printf("benchmarked %d shapes\n", benchmarked);
  return 0;
}
