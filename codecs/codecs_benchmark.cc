// Encode/decode throughput of every codec on the CPU as a fraction of memcpy, both measured in
// the same run on the same bytes: each round times a memcpy of the raw tensor, the encode and
// the decode back to back, and the table gives the medians. GB/s count the raw tensor's bytes
// (1 GB = 1e9 bytes). The codecs run on their pool (a thread per core); memcpy is one call.
//   bazel run -c opt //codecs:codecs_benchmark -- [--sizes=4194304,16777216] [--rounds=15]
//       [--target=scalar|avx2|avx512] [--filter=quant]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "codecs/codec.h"
#include "codecs/internal/simd.h"
#include "codecs/registry.h"

namespace actpack::codecs {
namespace {

// What a case encodes: post-ReLU values as a 1-D tensor (for `mask`, the ReLU's mask scaled
// like a dropout mask), a smooth 2-D field [n / 1024, 1024] (where eb's 2-D tiles and
// predictors pay), or post-ReLU values as NCHW maps [n / 64^3, 64, 64, 64] or as
// [n / 65536, 128 tokens, 512 hidden] (the layouts the division codecs low-pass over).
enum class Data { kActivations, kSmooth, kNchw, kTokens };

struct Case {
  const char* spec;
  Data data;
  const char* label;
};

constexpr Case kCases[] = {
    {"quant1", Data::kActivations, "1-D"},     {"quant2", Data::kActivations, "1-D"},
    {"quant4", Data::kActivations, "1-D"},     {"quant8", Data::kActivations, "1-D"},
    {"quant2", Data::kNchw, "NCHW"},           {"cast:fp16", Data::kActivations, "1-D"},
    {"cast:bf16", Data::kActivations, "1-D"},  {"mask", Data::kActivations, "1-D"},
    {"pool4", Data::kActivations, "1-D"},      {"division", Data::kNchw, "NCHW"},
    {"division", Data::kTokens, "tokens"},     {"eb:rel=1e-2", Data::kActivations, "1-D"},
    {"eb:rel=1e-3", Data::kActivations, "1-D"}, {"eb:rel=1e-2", Data::kSmooth, "smooth 2-D"},
    {"identity", Data::kActivations, "1-D"},   {"division_dct", Data::kNchw, "NCHW"},
    {"division_dct", Data::kTokens, "tokens"}, {"division_dct:keep=8,bits=2", Data::kNchw, "NCHW"},
};

std::vector<float> Input(size_t n, absl::string_view spec, Data data) {
  std::vector<float> v(n);
  if (data == Data::kSmooth) {
    for (size_t i = 0; i < n; ++i) {
      v[i] = std::sin(static_cast<float>(i % 1024) / 37.0f) *
             std::cos(static_cast<float>(i / 1024) / 23.0f);
    }
    return v;
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (float& x : v) x = std::max(0.0f, dist(rng));
  if (spec == "mask") {
    for (float& x : v) x = x > 0.0f ? 2.0f : 0.0f;
  }
  return v;
}

std::vector<int64_t> ShapeOf(size_t n, Data data) {
  const int64_t values = static_cast<int64_t>(n);
  switch (data) {
    case Data::kActivations: return {values};
    case Data::kSmooth: return {values / 1024, 1024};
    case Data::kNchw: return {values / (64 * 64 * 64), 64, 64, 64};
    default: return {values / (128 * 512), 128, 512};
  }
}

template <typename Fn>
double Seconds(Fn fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Options {
  std::vector<size_t> sizes = {size_t{4} << 20, size_t{16} << 20};
  int rounds = 15;
  std::string filter;
};

void Run(const Options& options) {
  std::printf("codecs_benchmark: %u hardware threads, target %s, median of %d rounds\n\n",
              std::thread::hardware_concurrency(), simd::TargetName(simd::ActiveTarget()),
              options.rounds);
  std::printf("| codec | data | values | ratio | encode GB/s | decode GB/s | memcpy GB/s | "
              "encode / memcpy | decode / memcpy |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (size_t n : options.sizes) {
    for (const Case& c : kCases) {
      if (!options.filter.empty() && std::string(c.spec).find(options.filter) == std::string::npos) {
        continue;
      }
      const std::vector<float> x = Input(n, c.spec, c.data);
      const CodecParams params = *ParseCodecSpec(c.spec);
      const TensorView input{x.data(), DType::kFloat32, ShapeOf(n, c.data), Device::kCpu};
      std::vector<uint32_t> buffer((*MaxEncodedSize(input.Spec(), params) + 3) / 4);
      uint8_t* bytes = reinterpret_cast<uint8_t*>(buffer.data());
      std::vector<float> y(n);
      const MutableTensorView output{y.data(), DType::kFloat32, ShapeOf(n, c.data), Device::kCpu};
      size_t used = *Encode(input, params, bytes, 4 * buffer.size(), {});  // warm up
      std::vector<double> copy, encode, decode;
      for (int r = 0; r < options.rounds; ++r) {
        copy.push_back(Seconds([&] { std::memcpy(y.data(), x.data(), n * sizeof(float)); }));
        encode.push_back(
            Seconds([&] { used = *Encode(input, params, bytes, 4 * buffer.size(), {}); }));
        decode.push_back(Seconds([&] {
          if (!Decode(bytes, used, output, {}).ok()) std::abort();
        }));
      }
      const double raw = static_cast<double>(n * sizeof(float));
      const double t_copy = Median(copy), t_encode = Median(encode), t_decode = Median(decode);
      std::printf("| %s | %s | %zu Mi | %.2f | %.2f | %.2f | %.2f | %.0f%% | %.0f%% |\n", c.spec,
                  c.label, n >> 20, raw / used, raw / t_encode / 1e9, raw / t_decode / 1e9,
                  raw / t_copy / 1e9, 100 * t_copy / t_encode, 100 * t_copy / t_decode);
      std::fflush(stdout);
    }
  }
}

Options ParseArgs(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    const size_t eq = arg.find('=');
    const absl::string_view key = arg.substr(0, eq);
    const absl::string_view value = eq == absl::string_view::npos ? "" : arg.substr(eq + 1);
    bool ok = true;
    if (key == "--sizes") {
      options.sizes.clear();
      for (absl::string_view s : absl::StrSplit(value, ',')) {
        size_t size = 0;
        ok = ok && absl::SimpleAtoi(s, &size) && size >= (size_t{1} << 20);
        options.sizes.push_back(size);
      }
    } else if (key == "--rounds") {
      ok = absl::SimpleAtoi(value, &options.rounds) && options.rounds > 0;
    } else if (key == "--filter") {
      options.filter = std::string(value);
    } else if (key == "--target") {
      ok = false;
      for (simd::Target t : simd::SupportedTargets()) {
        std::string name = simd::TargetName(t);
        name.erase(std::remove(name.begin(), name.end(), '-'), name.end());
        std::transform(name.begin(), name.end(), name.begin(), ::tolower);
        if (name == value) {
          simd::SetTargetForTest(t);
          ok = true;
        }
      }
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr,
                   "usage: codecs_benchmark [--sizes=N,...] (values, >= 2^20) [--rounds=R] "
                   "[--target=scalar|avx2|avx512] [--filter=SPEC_SUBSTRING]\n");
      std::exit(2);
    }
  }
  return options;
}

}  // namespace
}  // namespace actpack::codecs

int main(int argc, char** argv) {
  actpack::codecs::Run(actpack::codecs::ParseArgs(argc, argv));
  return 0;
}
