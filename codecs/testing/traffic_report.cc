// The memory traffic of every codec's CUDA kernels, measured on the CUDA emulator's race checker
// build (testing/cudaemu: control.h's KernelTraffic), printed as the table
// codecs/cuda/traffic.tsv holds: per codec, dtype, phase (encode, decode) and kernel, the
// requests, the 32-byte sectors per request against the ideal for the bytes asked for, the
// bytes asked for and the bytes DRAM must move per input byte, the passes over the input, the
// shared-memory wavefronts per request; then per codec, dtype and phase, a roofline estimate of
// its time on an H100 and an A100 as a fraction of a device-to-device copy of the input. The
// phases: encode, decode, and for the codecs whose size the device decides (eb, bitpack) place
// (PlaceDeferred into a target of the encoding's size), gather (GatherDeferred back into room
// for the bound) and decode_unresolved (DecodeDeferred from there before the status is read).
//
// tools/traffic_check.py builds and runs it (bazel run --config=cudaemu_race) and compares the
// output with the table. Usage: traffic_report [--bytes N] (input size, default 1 MiB).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "absl/strings/numbers.h"
#include "codecs/deferred.h"
#include "codecs/registry.h"
#include "codecs/testing/test_util.h"
#include "cudaemu/control.h"

namespace actpack::codecs {
namespace {

// Peak DRAM bandwidth (bytes/s) and what one kernel launch or copy costs at least on a GPU
// busy with a queue of them (launch latency hidden, ramp-up and tail not): the roofline's
// inputs. NVIDIA's data sheets: H100 SXM 3.35 TB/s, A100 40GB SXM 1.56 TB/s, 80GB 2.0 TB/s.
struct Gpu {
  const char* name;
  double bandwidth;
};
constexpr Gpu kGpus[] = {{"h100", 3.35e12}, {"a100", 2.0e12}};
constexpr double kPerLaunchSeconds = 2e-6;

struct Case {
  const char* spec;
  DType dtype;
};

std::vector<Case> Cases() {
  std::vector<Case> cases = {{"identity", DType::kFloat32}, {"cast", DType::kFloat32},
                             {"mask", DType::kBool}, {"bitpack", DType::kInt64}};
  for (const char* spec : {"quant2", "quant4", "quant8", "pool", "division", "division_dct", "eb"}) {
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      cases.push_back({spec, dtype});
    }
  }
  return cases;
}

std::vector<uint8_t> Input(DType dtype, size_t numel) {
  std::vector<uint8_t> bytes(numel * ElementSize(dtype));
  if (dtype == DType::kBool) {
    for (size_t i = 0; i < numel; ++i) bytes[i] = (i * 2654435761u >> 7) % 2;
  } else if (dtype == DType::kInt64) {
    for (size_t i = 0; i < numel; ++i) {
      const int64_t v = static_cast<int64_t>((i * 2654435761u >> 5) % 4096);  // max_pool indices
      std::memcpy(bytes.data() + 8 * i, &v, 8);
    }
  } else {
    bytes = testing::ToBytes(testing::Gaussian(numel, 7), dtype);
  }
  return bytes;
}

void* Device(size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes == 0 ? 1 : bytes) != cudaSuccess) std::abort();
  return p;
}

struct Phase {
  std::map<std::string, cudaemu::KernelTraffic> kernels;
};

void Print(const char* codec, DType dtype, const char* phase, const Phase& p, size_t input) {
  double seconds[2] = {0, 0};
  uint64_t launches = 0, dram = 0;
  for (const auto& [name, k] : p.kernels) {
    const double in = static_cast<double>(input);
    std::printf("%s\t%s\t%s\t%s\t%llu\t%llu\t%.3f\t%.3f\t%.4f\t%.4f\t%.3f\t%.2f\t\t\n", codec,
                std::string(DTypeName(dtype)).c_str(), phase, name.c_str(),
                static_cast<unsigned long long>(k.launches),
                static_cast<unsigned long long>(k.requests),
                k.requests ? static_cast<double>(k.sectors) / k.requests : 0.0,
                k.requests ? static_cast<double>(k.ideal_sectors) / k.requests : 0.0,
                k.bytes / in, 32.0 * k.unique_sectors / in, k.input_read_bytes / in,
                k.shared_requests ? static_cast<double>(k.shared_wavefronts) / k.shared_requests
                                  : 0.0);
    launches += k.launches;
    dram += 32 * k.unique_sectors;
  }
  // A device-to-device copy reads and writes the input once, in one launch.
  for (int g = 0; g < 2; ++g) {
    const double copy = 2.0 * input / kGpus[g].bandwidth + kPerLaunchSeconds;
    const double codec_time = dram / kGpus[g].bandwidth + launches * kPerLaunchSeconds;
    seconds[g] = copy / codec_time;
  }
  std::printf("%s\t%s\t%s\t(all)\t%llu\t\t\t\t\t%.4f\t\t\t%.2f\t%.2f\n", codec,
              std::string(DTypeName(dtype)).c_str(), phase,
              static_cast<unsigned long long>(launches), static_cast<double>(dram) / input,
              seconds[0], seconds[1]);
}

int SizedOnDevice(const Case& c, const DeferredEncoding& encoding,
                  const DeferredEncoding& resolved, uint8_t* buffer, size_t capacity,
                  DeviceStatus* status, void* output, const std::vector<int64_t>& shape,
                  size_t input_bytes, const ExecContext& context) {
  auto* target = static_cast<uint8_t*>(Device(resolved.bytes));
  auto* gathered = static_cast<uint8_t*>(Device(capacity));
  absl::Status ok = absl::OkStatus();
  cudaemu::StartTrafficRecording(false);
  cudaemu::SetTrafficInput(buffer, resolved.bytes);
  ok.Update(PlaceDeferred(buffer, encoding.bytes, target, resolved.bytes, SpillArena{}, status,
                          context));
  cudaDeviceSynchronize();
  Phase place{cudaemu::StopTrafficRecording()};
  cudaemu::StartTrafficRecording(false);
  cudaemu::SetTrafficInput(target, resolved.bytes);
  ok.Update(GatherDeferred(target, resolved.bytes, SpillArena{}, status, gathered, capacity,
                           context));
  cudaDeviceSynchronize();
  Phase gather{cudaemu::StopTrafficRecording()};
  cudaemu::StartTrafficRecording(false);
  cudaemu::SetTrafficInput(gathered, resolved.bytes);
  ok.Update(DecodeDeferred(encoding, gathered, {output, c.dtype, shape, Device::kCuda}, context,
                           status));
  cudaDeviceSynchronize();
  Phase decode{cudaemu::StopTrafficRecording()};
  DeviceStatus read;
  cudaMemcpy(&read, status, sizeof(read), cudaMemcpyDeviceToHost);
  if (!ok.ok() || read.failures != 0) {
    std::fprintf(stderr, "%s: placed and unresolved: %s %s\n", c.spec,
                 std::string(ok.message()).c_str(), DescribeFailures(read.failures).c_str());
    return 1;
  }
  Print(c.spec, c.dtype, "place", place, input_bytes);
  Print(c.spec, c.dtype, "gather", gather, input_bytes);
  Print(c.spec, c.dtype, "decode_unresolved", decode, input_bytes);
  cudaFree(target);
  cudaFree(gathered);
  return 0;
}

int Run(size_t input_bytes) {
  if (!cudaemu::StartTrafficRecording(false)) {
    std::fprintf(stderr, "traffic_report: build with --config=cudaemu_race\n");
    return 2;
  }
  cudaemu::StopTrafficRecording();
  std::printf("codec\tdtype\tphase\tkernel\tlaunches\trequests\tsectors_per_request\t"
              "ideal_per_request\tbytes_per_input_byte\tdram_per_input_byte\tinput_passes\t"
              "shared_wavefronts_per_request\th100_fraction_of_copy\ta100_fraction_of_copy\n");
  ExecContext context;
  context.device = Device::kCuda;
  auto* status = static_cast<DeviceStatus*>(Device(sizeof(DeviceStatus)));
  for (const Case& c : Cases()) {
    const size_t width = ElementSize(c.dtype);
    // [n, 16, 64, 64]: a batch of 16-channel 64 x 64 activations.
    const int64_t n = std::max<int64_t>(1, static_cast<int64_t>(input_bytes / width / 65536));
    const std::vector<int64_t> shape = {n, 16, 64, 64};
    const size_t numel = static_cast<size_t>(n) * 65536;
    const std::vector<uint8_t> host = Input(c.dtype, numel);
    void* input = Device(host.size());
    cudaMemcpy(input, host.data(), host.size(), cudaMemcpyHostToDevice);
    const CodecParams params = *ParseCodecSpec(c.spec);
    const size_t capacity = *MaxEncodedSize({c.dtype, shape}, params);
    auto* buffer = static_cast<uint8_t*>(Device(capacity));
    void* output = Device(host.size());

    cudaemu::StartTrafficRecording(false);
    cudaemu::SetTrafficInput(input, host.size());
    absl::StatusOr<DeferredEncoding> encoding = EncodeDeferred(
        {input, c.dtype, shape, Device::kCuda}, params, buffer, capacity, context, status);
    cudaDeviceSynchronize();
    Phase encode{cudaemu::StopTrafficRecording()};
    if (!encoding.ok()) {
      std::fprintf(stderr, "%s: %s\n", c.spec, std::string(encoding.status().message()).c_str());
      return 1;
    }
    DeviceStatus read;
    cudaMemcpy(&read, status, sizeof(read), cudaMemcpyDeviceToHost);
    const DeferredEncoding resolved = Resolve(*encoding, read);

    cudaemu::StartTrafficRecording(false);
    cudaemu::SetTrafficInput(buffer, resolved.bytes);
    const absl::Status decoded = DecodeDeferred(resolved, buffer,
                                                {output, c.dtype, shape, Device::kCuda}, context,
                                                status);
    cudaDeviceSynchronize();
    Phase decode{cudaemu::StopTrafficRecording()};
    if (!decoded.ok()) {
      std::fprintf(stderr, "%s: %s\n", c.spec, std::string(decoded.message()).c_str());
      return 1;
    }
    Print(c.spec, c.dtype, "encode", encode, host.size());
    Print(c.spec, c.dtype, "decode", decode, host.size());
    if (encoding->device_decided && encoding->header.payload_size == 0) {
      // The size is the device's: the move into a target of exactly that size, the copy back
      // into room for the bound, and the decode of the unresolved encoding from there (with
      // the encode's status, as before its read).
      const int status_ok = SizedOnDevice(c, *encoding, resolved, buffer, capacity, status,
                                          output, shape, host.size(), context);
      if (status_ok != 0) return status_ok;
    }
    cudaFree(input);
    cudaFree(buffer);
    cudaFree(output);
  }
  return 0;
}

}  // namespace
}  // namespace actpack::codecs

int main(int argc, char** argv) {
  size_t bytes = size_t{1} << 20;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--bytes" && !absl::SimpleAtoi(argv[i + 1], &bytes)) {
      std::fprintf(stderr, "traffic_report: --bytes takes a byte count, not '%s'\n", argv[i + 1]);
      return 2;
    }
  }
  return actpack::codecs::Run(bytes);
}
