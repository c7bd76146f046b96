#include "codecs/testing/device_runner.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "codecs/deferred.h"

#if ACTPACK_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace actpack::codecs::testing {
namespace {

uint64_t Bytes(DType dtype, const std::vector<int64_t>& shape) {
  return TensorSpec{dtype, shape}.numel() * ElementSize(dtype);
}

#if ACTPACK_WITH_CUDA

absl::Status Check(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  (void)cudaGetLastError();
  return absl::InternalError(absl::StrCat("test harness: ", what, ": ", cudaGetErrorName(error)));
}

// Device memory of exactly `bytes` (none for 0), freed on destruction.
class DeviceMemory {
 public:
  explicit DeviceMemory(size_t bytes) : bytes_(bytes) {
    if (bytes > 0) status_ = Check(cudaMalloc(&data_, bytes), "cudaMalloc");
  }
  ~DeviceMemory() {
    if (data_ != nullptr) (void)cudaFree(data_);
  }
  const absl::Status& status() const { return status_; }
  uint8_t* data() const { return static_cast<uint8_t*>(data_); }

 private:
  size_t bytes_;
  void* data_ = nullptr;
  absl::Status status_;
};

absl::Status ToDevice(void* device, const void* host, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return absl::OkStatus();
  absl::Status s = Check(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream),
                         "cudaMemcpyAsync to the device");
  if (!s.ok()) return s;
  return Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

absl::Status ToHost(void* host, const void* device, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return absl::OkStatus();
  absl::Status s = Check(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream),
                         "cudaMemcpyAsync to the host");
  if (!s.ok()) return s;
  return Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

#endif  // ACTPACK_WITH_CUDA

}  // namespace

// The ExecContext's scratch: plain cudaMalloc, counted (the runtime passes its budgeted pool).
class DeviceRunner::Scratch final : public ScratchAllocator {
 public:
  absl::StatusOr<void*> Allocate(size_t bytes, void* stream) override {
#if ACTPACK_WITH_CUDA
    void* p = nullptr;
    absl::Status s = Check(cudaMalloc(&p, bytes), "cudaMalloc for scratch");
    if (!s.ok()) return s;
    ++allocations;
    return p;
#else
    return absl::UnimplementedError("no CUDA");
#endif
  }
  void Deallocate(void* ptr, size_t bytes, void* stream) override {
#if ACTPACK_WITH_CUDA
    (void)cudaFree(ptr);
#endif
  }
  int64_t allocations = 0;
};

int64_t DeviceRunner::scratch_allocations() const { return scratch_->allocations; }

DeviceRunner::DeviceRunner(Device device)
    : device_(device), scratch_(std::make_unique<Scratch>()) {
  context_.device = device;
  if (device == Device::kCpu) return;
  context_.scratch = scratch_.get();
#if ACTPACK_WITH_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    why_unavailable_ = "no CUDA device visible";
    return;
  }
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    why_unavailable_ = "cannot create a CUDA stream";
    return;
  }
  context_.stream = stream;
#else
  why_unavailable_ =
      "built without CUDA (bazel test --config=cudaemu runs these cases on the CUDA emulator)";
#endif
}

DeviceRunner::~DeviceRunner() {
#if ACTPACK_WITH_CUDA
  if (context_.stream != nullptr) (void)cudaStreamDestroy(static_cast<cudaStream_t>(context_.stream));
#endif
}

absl::StatusOr<std::vector<uint8_t>> DeviceRunner::Encode(const std::vector<uint8_t>& input,
                                                          DType dtype,
                                                          const std::vector<int64_t>& shape,
                                                          const CodecParams& params) {
  absl::StatusOr<size_t> capacity = MaxEncodedSize({dtype, shape}, params);
  if (!capacity.ok()) return capacity.status();
  std::vector<uint8_t> out(*capacity);
  if (device_ == Device::kCpu) {
    absl::StatusOr<size_t> used =
        codecs::Encode({input.data(), dtype, shape, Device::kCpu}, params, out.data(), out.size(),
                       context_);
    if (!used.ok()) return used.status();
    out.resize(*used);
    return out;
  }
#if ACTPACK_WITH_CUDA
  const cudaStream_t stream = static_cast<cudaStream_t>(context_.stream);
  DeviceMemory in(input.size()), buffer(*capacity);
  if (!in.status().ok()) return in.status();
  if (!buffer.status().ok()) return buffer.status();
  absl::Status s = ToDevice(in.data(), input.data(), input.size(), stream);
  if (!s.ok()) return s;
  absl::StatusOr<size_t> used = codecs::Encode({in.data(), dtype, shape, Device::kCuda}, params,
                                               buffer.data(), *capacity, context_);
  if (!used.ok()) return used.status();
  out.resize(*used);
  s = ToHost(out.data(), buffer.data(), *used, stream);
  if (!s.ok()) return s;
  return out;
#else
  return absl::FailedPreconditionError(why_unavailable_);
#endif
}

absl::Status DeviceRunner::Decode(const std::vector<uint8_t>& buffer, size_t size, DType dtype,
                                  const std::vector<int64_t>& shape,
                                  std::vector<uint8_t>* output) {
  const uint64_t bytes = Bytes(dtype, shape);
  output->assign(bytes, 0xA5);
  if (device_ == Device::kCpu) {
    return codecs::Decode(buffer.data(), size, {output->data(), dtype, shape, Device::kCpu},
                          context_);
  }
#if ACTPACK_WITH_CUDA
  const cudaStream_t stream = static_cast<cudaStream_t>(context_.stream);
  DeviceMemory in(size), out(bytes);
  if (!in.status().ok()) return in.status();
  if (!out.status().ok()) return out.status();
  absl::Status s = ToDevice(in.data(), buffer.data(), size, stream);
  if (!s.ok()) return s;
  s = ToDevice(out.data(), output->data(), bytes, stream);
  if (!s.ok()) return s;
  const absl::Status decoded =
      codecs::Decode(in.data(), size, {out.data(), dtype, shape, Device::kCuda}, context_);
  s = ToHost(output->data(), out.data(), bytes, stream);
  if (!s.ok()) return s;
  return decoded;
#else
  return absl::FailedPreconditionError(why_unavailable_);
#endif
}

absl::StatusOr<std::vector<uint8_t>> DeviceRunner::EncodePlaced(
    const std::vector<uint8_t>& input, DType dtype, const std::vector<int64_t>& shape,
    const CodecParams& params, size_t target_capacity, std::vector<uint8_t>* unresolved,
    uint64_t* failures) {
  const uint64_t bytes = Bytes(dtype, shape);
  unresolved->assign(bytes, 0xA5);
  if (device_ == Device::kCpu) return absl::FailedPreconditionError("a deferred call is CUDA's");
#if ACTPACK_WITH_CUDA
  absl::StatusOr<size_t> capacity = MaxEncodedSize({dtype, shape}, params);
  if (!capacity.ok()) return capacity.status();
  const cudaStream_t stream = static_cast<cudaStream_t>(context_.stream);
  DeviceMemory in(input.size()), staging(*capacity), target(target_capacity), dest(*capacity),
      out(bytes), statuses(2 * sizeof(DeviceStatus));
  for (const DeviceMemory* m : {&in, &staging, &target, &dest, &out, &statuses}) {
    if (!m->status().ok()) return m->status();
  }
  DeviceStatus* encode_status = reinterpret_cast<DeviceStatus*>(statuses.data());
  DeviceStatus* decode_status = encode_status + 1;
  absl::Status s = ToDevice(in.data(), input.data(), input.size(), stream);
  if (s.ok()) s = ToDevice(out.data(), unresolved->data(), bytes, stream);
  if (!s.ok()) return s;
  absl::StatusOr<DeferredEncoding> encoding =
      EncodeDeferred({in.data(), dtype, shape, Device::kCuda}, params, staging.data(), *capacity,
                     context_, encode_status);
  if (!encoding.ok()) return encoding.status();
  s = PlaceDeferred(staging.data(), encoding->bytes, target.data(), target_capacity, SpillArena{},
                    encode_status, context_);
  if (s.ok()) {
    s = GatherDeferred(target.data(), target_capacity, SpillArena{}, encode_status, dest.data(),
                       *capacity, context_);
  }
  if (s.ok()) {
    s = Check(cudaMemcpyAsync(decode_status, encode_status, sizeof(DeviceStatus),
                              cudaMemcpyDeviceToDevice, stream),
              "cudaMemcpyAsync of the status");
  }
  if (s.ok()) {
    s = DecodeDeferred(*encoding, dest.data(), {out.data(), dtype, shape, Device::kCuda},
                       context_, decode_status);
  }
  if (s.ok()) s = ToHost(unresolved->data(), out.data(), bytes, stream);
  DeviceStatus read[2];
  if (s.ok()) s = ToHost(read, statuses.data(), sizeof(read), stream);
  if (!s.ok()) return s;
  *failures = read[1].failures;
  std::vector<uint8_t> encoded(Resolve(*encoding, read[0]).bytes);
  if (encoded.size() > encoding->bytes) return absl::DataLossError("an encoding past its bound");
  s = ToHost(encoded.data(), staging.data(), encoded.size(), stream);
  if (!s.ok()) return s;
  return encoded;
#else
  return absl::FailedPreconditionError(why_unavailable_);
#endif
}

absl::StatusOr<Header> DeviceRunner::Verify(const std::vector<uint8_t>& buffer, size_t size) {
  if (device_ == Device::kCpu) return codecs::Verify(buffer.data(), size, context_);
#if ACTPACK_WITH_CUDA
  DeviceMemory in(size);
  if (!in.status().ok()) return in.status();
  absl::Status s = ToDevice(in.data(), buffer.data(), size,
                            static_cast<cudaStream_t>(context_.stream));
  if (!s.ok()) return s;
  return codecs::Verify(in.data(), size, context_);
#else
  return absl::FailedPreconditionError(why_unavailable_);
#endif
}

}  // namespace actpack::codecs::testing
