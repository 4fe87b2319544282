// tunecache.hpp: a header-only C++17 wrapper on the tunecache C ABI (tunecache.h).
//
// RAII handles, std::optional lookups, and tunecache::error (an exception carrying the
// TC_E_* code and tc_last_error's message) for every failure. Every member function may be
// called from any thread; one Cache may be shared by all threads of a process.
//
//   tunecache::Fields scope;
//   scope.set("device", "NVIDIA H100 80GB HBM3").set("cudnn", 90100);
//   tunecache::Cache cache("my-conv-lib", 1, &scope);             // the default file
//   auto conv = cache.ns<ConvParams>("conv_fwd");                   // byte keys of one POD
//   if (auto hit = conv.find(params)) use(hit->algorithm);
//   else conv.record(params, "implicit_gemm", {/*median_ns=*/1250.0});
//
// tunecache::BenchmarkCache<Key, T> has the find/insert interface of ATen's cuDNN
// BenchmarkCache<T>, persisted (see examples/benchmark_cache.cpp).
#ifndef TUNECACHE_HPP
#define TUNECACHE_HPP

#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "tunecache.h"

namespace tunecache {

// A failed call: what() is tc_last_error's message, code() the TC_E_* code.
class error : public std::runtime_error {
 public:
  error(int code, const std::string& message) : std::runtime_error(message), code_(code) {}
  int code() const noexcept { return code_; }

 private:
  int code_;
};

namespace detail {

inline std::string last_error() {
  std::string message(tc_last_error(nullptr, 0), '\0');
  tc_last_error(message.data(), message.size() + 1);
  return message;
}

// Throws for a negative status; returns the others (TC_OK, TC_MISS, TC_BUSY).
inline int check(int status) {
  if (status < 0) throw error(status, last_error());
  return status;
}

inline std::string hex_of(const void* bytes, std::size_t len) {
  static const char digits[] = "0123456789abcdef";
  std::string out(len * 2, '\0');
  const auto* b = static_cast<const unsigned char*>(bytes);
  for (std::size_t i = 0; i < len; ++i) {
    out[2 * i] = digits[b[i] >> 4];
    out[2 * i + 1] = digits[b[i] & 15];
  }
  return out;
}

}  // namespace detail

// Typed fields: a key, a scope, or a candidate's params.
class Fields {
 public:
  Fields() : fields_(tc_fields_new()) {}
  ~Fields() { tc_fields_free(fields_); }
  Fields(const Fields&) = delete;
  Fields& operator=(const Fields&) = delete;
  Fields(Fields&& other) noexcept : fields_(std::exchange(other.fields_, nullptr)) {}
  Fields& operator=(Fields&& other) noexcept {
    std::swap(fields_, other.fields_);
    return *this;
  }

  template <class I, std::enable_if_t<std::is_integral_v<I> && !std::is_same_v<I, bool>, int> = 0>
  Fields& set(const char* name, I value) {
    detail::check(tc_fields_int(fields_, name, static_cast<int64_t>(value)));
    return *this;
  }
  Fields& set(const char* name, bool value) {
    detail::check(tc_fields_bool(fields_, name, value ? 1 : 0));
    return *this;
  }
  Fields& set(const char* name, const char* value) {
    detail::check(tc_fields_str(fields_, name, value));
    return *this;
  }
  Fields& set(const char* name, const std::string& value) { return set(name, value.c_str()); }
  // Every field of a JSON object (lists and nested objects allowed; no floats, no null).
  Fields& json(const std::string& object) {
    detail::check(tc_fields_json(fields_, object.c_str()));
    return *this;
  }
  const tc_fields* get() const noexcept { return fields_; }

 private:
  tc_fields* fields_;
};

// A measurement for record(): times in nanoseconds (min 0: the median).
struct Measurement {
  double median_ns = 0;
  double min_ns = 0;
  double spread_ns = 0;
  uint32_t samples = 1;
  uint64_t tuning_ns = 0;
};

// The winner of a key.
struct Winner {
  std::string algorithm;
  std::string params_json;
  double median_ns = 0;
  double min_ns = 0;
  double spread_ns = 0;
  uint32_t samples = 0;
  uint32_t candidates = 0;
};

// One ranked candidate of a key.
struct Candidate {
  std::string algorithm;
  std::string params_json;
  std::optional<std::string> failure;  // set when it failed
  double median_ns = 0;
  double min_ns = 0;
  double spread_ns = 0;
  uint32_t samples = 0;
  uint64_t measured_at_ms = 0;  // when it was measured, milliseconds since the Unix epoch
};

// A held claim on one key: this caller alone measures it until the claim is destroyed.
class Claim {
 public:
  Claim() = default;
  explicit Claim(tc_claim* claim) : claim_(claim) {}
  ~Claim() { tc_claim_release(claim_); }
  Claim(const Claim&) = delete;
  Claim& operator=(const Claim&) = delete;
  Claim(Claim&& other) noexcept : claim_(std::exchange(other.claim_, nullptr)) {}
  Claim& operator=(Claim&& other) noexcept {
    std::swap(claim_, other.claim_);
    return *this;
  }
  // False when another thread or process held the key for longer than the wait.
  explicit operator bool() const noexcept { return claim_ != nullptr; }

 private:
  tc_claim* claim_ = nullptr;
};

// A key as the C ABI takes it: the bytes of a POD, or typed fields.
struct KeyView {
  const void* bytes = nullptr;
  std::size_t len = 0;
  const Fields* fields = nullptr;

  template <class K>
  static KeyView of(const K& key) {
    if constexpr (std::is_same_v<K, Fields>) {
      return KeyView{nullptr, 0, &key};
    } else {
      static_assert(std::is_trivially_copyable_v<K>,
                    "a byte key is a trivially copyable POD; zero it (memset) before filling it "
                    "so that its padding is the same every time");
      return KeyView{&key, sizeof(K), nullptr};
    }
  }
};

// One namespace of a cache: lookups, records and claims of its keys. Cheap to copy.
class Namespace {
 public:
  explicit Namespace(tc_ns* ns) : ns_(ns) {}

  template <class K>
  std::optional<Winner> find(const K& key) const {
    return find_key(KeyView::of(key));
  }

  // Every candidate of the key, best first (empty on a miss).
  template <class K>
  std::vector<Candidate> candidates(const K& key) const {
    KeyView k = KeyView::of(key);
    tc_entry* entry = nullptr;
    int status = k.fields ? tc_entry_get_fields(ns_, k.fields->get(), &entry)
                          : tc_entry_get(ns_, k.bytes, k.len, &entry);
    std::vector<Candidate> out;
    if (detail::check(status) == TC_MISS) return out;
    std::size_t n = tc_entry_count(entry);
    out.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      tc_candidate c;
      if (tc_entry_candidate(entry, i, &c) != TC_OK) break;
      Candidate cand;
      cand.algorithm = c.algorithm;
      cand.params_json = c.params_json;
      if (c.failed) cand.failure = std::string(c.failed);
      cand.median_ns = c.median_ns;
      cand.min_ns = c.min_ns;
      cand.spread_ns = c.spread_ns;
      cand.samples = c.samples;
      cand.measured_at_ms = c.measured_at_ms;
      out.push_back(std::move(cand));
    }
    tc_entry_free(entry);
    return out;
  }

  template <class K>
  void record(const K& key, const std::string& algorithm, const Measurement& m,
              const Fields* params = nullptr) const {
    tc_measurement tm{};
    tm.median_ns = m.median_ns;
    tm.min_ns = m.min_ns;
    tm.spread_ns = m.spread_ns;
    tm.samples = m.samples;
    tm.tuning_ns = m.tuning_ns;
    record_key(KeyView::of(key), algorithm, tm, params);
  }

  template <class K>
  void record_failure(const K& key, const std::string& algorithm, const std::string& reason,
                      const Fields* params = nullptr) const {
    tc_measurement tm{};
    tm.failed = reason.c_str();
    record_key(KeyView::of(key), algorithm, tm, params);
  }

  template <class K>
  Claim claim(const K& key, std::chrono::milliseconds wait) const {
    KeyView k = KeyView::of(key);
    tc_claim* claim = nullptr;
    auto ms = static_cast<uint32_t>(wait.count() < 0 ? 0 : wait.count());
    int status = k.fields ? tc_claim_take_fields(ns_, k.fields->get(), ms, &claim)
                          : tc_claim_take(ns_, k.bytes, k.len, ms, &claim);
    detail::check(status);
    return Claim(claim);
  }

  tc_ns* get() const noexcept { return ns_; }

 private:
  std::optional<Winner> find_key(KeyView k) const {
    char name[128];
    tc_result r{};
    r.algorithm = name;
    r.algorithm_cap = sizeof name;
    int status = k.fields ? tc_get_fields(ns_, k.fields->get(), &r)
                          : tc_get(ns_, k.bytes, k.len, &r);
    std::string algorithm;
    if (status == TC_E_BUFFER) {  // a name longer than the stack buffer: ask again
      algorithm.resize(r.algorithm_len);
      r.algorithm = algorithm.data();
      r.algorithm_cap = algorithm.size() + 1;
      status = k.fields ? tc_get_fields(ns_, k.fields->get(), &r)
                        : tc_get(ns_, k.bytes, k.len, &r);
    } else if (status == TC_OK) {
      algorithm.assign(name, r.algorithm_len);
    }
    if (detail::check(status) == TC_MISS || r.failed) return std::nullopt;
    Winner w;
    w.algorithm = std::move(algorithm);
    w.median_ns = r.median_ns;
    w.min_ns = r.min_ns;
    w.spread_ns = r.spread_ns;
    w.samples = r.samples;
    w.candidates = r.candidates;
    return w;
  }

  void record_key(KeyView k, const std::string& algorithm, const tc_measurement& m,
                  const Fields* params) const {
    const tc_fields* p = params ? params->get() : nullptr;
    detail::check(k.fields ? tc_record_fields(ns_, k.fields->get(), algorithm.c_str(), p, &m)
                           : tc_record(ns_, k.bytes, k.len, algorithm.c_str(), p, &m));
  }

  tc_ns* ns_;
};

// An open cache; saved and closed when destroyed (or by close()).
class Cache {
 public:
  // `scope`: the fields that say which results may be shared (device name, SM count, driver,
  // library versions); `path`: the file (null: $TUNECACHE_FILE, $TUNECACHE_DIR/<app>.tcache,
  // or the user cache directory).
  Cache(const std::string& app, uint32_t schema, const Fields* scope = nullptr,
        const char* path = nullptr, const tc_options* options = nullptr) {
    if (tc_abi_version() != TC_ABI_VERSION)
      throw error(TC_E_ARG, "libtunecache's ABI version differs from tunecache.h's");
    detail::check(
        tc_open(app.c_str(), schema, scope ? scope->get() : nullptr, path, options, &cache_));
  }
  ~Cache() { tc_close(cache_); }
  Cache(const Cache&) = delete;
  Cache& operator=(const Cache&) = delete;

  // The namespace `name` for keys of any kind (byte keys of any length, or Fields).
  Namespace ns(const std::string& name) const { return make_ns(name, 0); }
  // The namespace `name` for byte keys of type K only (another length is refused).
  template <class K>
  Namespace ns(const std::string& name) const {
    static_assert(std::is_trivially_copyable_v<K>, "a byte key is a trivially copyable POD");
    return make_ns(name, sizeof(K));
  }

  // Makes every record durable within `timeout` (0: the cache's flush timeout).
  void flush(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) {
    detail::check(tc_flush(cache_, static_cast<uint32_t>(timeout.count())));
  }
  void refresh() { detail::check(tc_refresh(cache_)); }
  // TC_MODE_PERSISTENT, TC_MODE_READ_ONLY or TC_MODE_MEMORY.
  int mode() const { return detail::check(tc_mode(cache_)); }
  std::size_t size() const {
    std::size_t n = 0;
    detail::check(tc_len(cache_, &n));
    return n;
  }
  void close() { detail::check(tc_close(cache_)); }
  tc_cache* get() const noexcept { return cache_; }

 private:
  Namespace make_ns(const std::string& name, std::size_t key_size) const {
    tc_ns* ns = nullptr;
    detail::check(tc_namespace(cache_, name.c_str(), key_size, &ns));
    return Namespace(ns);
  }

  tc_cache* cache_ = nullptr;
};

// How a BenchmarkCache stores a value T: the default takes T with members `algo` (an enum or
// integer) and `time` (milliseconds, as cuDNN's perf structs have), names the candidate
// "algo=<n>", and keeps T's bytes with `time` zeroed as the param "pod", so that a
// re-measurement of the same algorithm replaces its time rather than adding a candidate;
// find() returns T as inserted, its `time` the stored measurement's (set_time). Specialize it
// for other types (set_time is optional: without it find() returns what from() decodes).
template <class T, class = void>
struct value_traits {
  static_assert(sizeof(T) == 0,
                "specialize tunecache::value_traits<T> (algorithm, time_ns, params, from) for a "
                "value without members `algo` and `time`");
};

template <class T>
struct value_traits<T, std::void_t<decltype(std::declval<T>().algo), decltype(std::declval<T>().time)>> {
  static_assert(std::is_trivially_copyable_v<T>, "the value is a trivially copyable POD");
  static std::string algorithm(const T& v) {
    return "algo=" + std::to_string(static_cast<long long>(v.algo));
  }
  static double time_ns(const T& v) { return static_cast<double>(v.time) * 1e6; }
  // The candidate's identity: the time is the measurement, not part of what was measured.
  static void params(const T& v, Fields& out) {
    T pod = v;
    pod.time = {};
    out.set("pod", detail::hex_of(&pod, sizeof pod));
  }
  static void set_time(T& v, double time_ns) {
    v.time = static_cast<decltype(v.time)>(time_ns / 1e6);
  }
  // A value decoded from a pod written before `time` left it (tunecache before December
  // 2026): its time is in the pod.
  static bool time_in_pod(const T& v) { return v.time != decltype(v.time){}; }
  // That pod, with the time where the old layout kept it (the candidate's identity then).
  static void old_params(const T& v, Fields& out) { out.set("pod", detail::hex_of(&v, sizeof v)); }
  // T from the params JSON `{"pod":"<hex>"}` that params() made.
  static bool from(std::string_view params_json, T* out) {
    constexpr std::string_view tag = "\"pod\":\"";
    auto at = params_json.find(tag);
    if (at == std::string_view::npos || params_json.size() < at + tag.size() + 2 * sizeof(T))
      return false;
    auto nibble = [](char h) { return h <= '9' ? h - '0' : h - 'a' + 10; };
    unsigned char bytes[sizeof(T)];
    for (std::size_t i = 0; i < sizeof(T); ++i) {
      const char* p = params_json.data() + at + tag.size() + 2 * i;
      bytes[i] = static_cast<unsigned char>(nibble(p[0]) << 4 | nibble(p[1]));
    }
    std::memcpy(out, bytes, sizeof(T));
    return true;
  }
};

// ATen's cuDNN BenchmarkCache<T> interface, persisted: find() and insert() on a POD key.
// Replace `BenchmarkCache<T> cache;` with `tunecache::BenchmarkCache<Key, T> cache(tc, "ns");`.
template <class Key, class T, class Traits = value_traits<T>>
class BenchmarkCache {
 public:
  BenchmarkCache(Cache& cache, const std::string& name) : ns_(cache.ns<Key>(name)) {}

  // The best value recorded for `key` (the fastest, whichever thread or process inserted it).
  bool find(const Key& key, T* results) const {
    bool old_layout = false;
    if (!find_once(key, results, &old_layout)) return false;
    // A winner of the old layout (its time in its pod): the key is brought over once, then
    // asked again.
    if (old_layout && bring_over(key)) return find_once(key, results, &old_layout);
    return true;
  }

  void insert(const Key& key, const T& results) {
    Fields params;
    Traits::params(results, params);
    Measurement m;
    m.median_ns = Traits::time_ns(results);
    ns_.record(key, Traits::algorithm(results), m, &params);
  }

  const Namespace& ns() const noexcept { return ns_; }

 private:
  template <class Tr, class = void>
  struct has_set_time : std::false_type {};
  template <class Tr>
  struct has_set_time<Tr, std::void_t<decltype(Tr::set_time(std::declval<T&>(), 0.0))>>
      : std::true_type {};

  template <class Tr, class = void>
  struct has_old_layout : std::false_type {};
  template <class Tr>
  struct has_old_layout<Tr, std::void_t<decltype(Tr::time_in_pod(std::declval<const T&>()))>>
      : std::true_type {};

  // One lookup. `old_layout`: the winner's pod holds its time (written before `time` left
  // it; its time is then the pod's, which is the measurement's).
  bool find_once(const Key& key, T* results, bool* old_layout) const {
    char name[128];
    char params[2 * sizeof(T) + 64];
    tc_result r{};
    r.algorithm = name;
    r.algorithm_cap = sizeof name;
    r.params = params;
    r.params_cap = sizeof params;
    int status = tc_get(ns_.get(), &key, sizeof key, &r);
    if (status == TC_E_BUFFER) {  // a longer name or params than the default layout: again
      std::string long_name(r.algorithm_len + 1, '\0'), long_params(r.params_len + 1, '\0');
      r.algorithm = long_name.data();
      r.algorithm_cap = long_name.size();
      r.params = long_params.data();
      r.params_cap = long_params.size();
      status = tc_get(ns_.get(), &key, sizeof key, &r);
      if (detail::check(status) == TC_MISS || r.failed) return false;
      return decode(std::string_view(r.params, r.params_len), r.median_ns, results, old_layout);
    }
    if (detail::check(status) == TC_MISS || r.failed) return false;
    return decode(std::string_view(params, r.params_len), r.median_ns, results, old_layout);
  }

  static bool decode(std::string_view params_json, double median_ns, T* out, bool* old_layout) {
    if (!Traits::from(params_json, out)) return false;
    if constexpr (has_old_layout<Traits>::value) {
      if (Traits::time_in_pod(*out)) {
        *old_layout = true;
        return true;
      }
    }
    if constexpr (has_set_time<Traits>::value) Traits::set_time(*out, median_ns);
    return true;
  }

  // find() met a winner of the old layout (a value whose pod holds its time: a candidate per
  // measurement, written before `time` left the pod). Every old candidate of the key that has
  // not failed is recorded as superseded (a failure, so it ranks last): by the same value's
  // result in this layout where there is one (recorded since the upgrade, so later), else by
  // its latest old result recorded again in this layout. One pass, once per key. False: a
  // value type without the old layout, or nothing to bring over.
  bool bring_over(const Key& key) const {
    if constexpr (has_old_layout<Traits>::value) {
      struct Old {
        T latest;
        uint64_t at = 0;
        std::vector<T> all;
      };
      std::map<std::string, Old> old;   // by algorithm and pod without the time
      std::set<std::string> measured;  // the same, of this layout's candidates
      for (const auto& c : ns_.candidates(key)) {
        T v;
        if (!Traits::from(c.params_json, &v)) continue;
        bool in_pod = Traits::time_in_pod(v);
        T zeroed = v;
        zeroed.time = {};
        std::string id = c.algorithm + "\n" + detail::hex_of(&zeroed, sizeof zeroed);
        if (!in_pod) {
          measured.insert(id);
        } else if (!c.failure) {
          Old& o = old[id];
          if (o.all.empty() || c.measured_at_ms > o.at) {
            o.latest = v;
            o.at = c.measured_at_ms;
          }
          o.all.push_back(v);
        }
      }
      for (const auto& [id, o] : old) {
        const std::string algorithm = Traits::algorithm(o.latest);
        const bool again = measured.count(id) > 0;
        if (!again) {
          Fields now;
          Traits::params(o.latest, now);
          Measurement m;
          m.median_ns = Traits::time_ns(o.latest);
          ns_.record(key, algorithm, m, &now);
        }
        for (const T& v : o.all) {
          Fields was;
          Traits::old_params(v, was);
          ns_.record_failure(key, algorithm,
                             again ? "superseded: measured again since"
                                   : "superseded: kept without its time in its params",
                             &was);
        }
      }
      return !old.empty();
    } else {
      (void)key;
      return false;
    }
  }

  Namespace ns_;
};

}  // namespace tunecache

#endif  // TUNECACHE_HPP
