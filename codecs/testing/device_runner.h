// Runs the codecs with the tensor and the buffer in memory on one device, taking and giving
// host bytes, so that a test can run every case on the CPU and on CUDA (a GPU, or the emulator
// under --config=cudaemu) and compare the two.
//
// Usage:
//   DeviceRunner cuda(Device::kCuda);
//   if (!cuda.available()) GTEST_SKIP() << cuda.why_unavailable();
//   absl::StatusOr<std::vector<uint8_t>> buffer = cuda.Encode(input_bytes, dtype, shape, params);
//   std::vector<uint8_t> output;
//   absl::Status status = cuda.Decode(*buffer, buffer->size(), dtype, shape, &output);
#ifndef ACTPACK_CODECS_TESTING_DEVICE_RUNNER_H_
#define ACTPACK_CODECS_TESTING_DEVICE_RUNNER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "codecs/codec.h"

namespace actpack::codecs::testing {

class DeviceRunner {
 public:
  // On CUDA the runner works on a stream of its own (non-blocking), on device 0.
  explicit DeviceRunner(Device device);
  ~DeviceRunner();
  DeviceRunner(const DeviceRunner&) = delete;
  DeviceRunner& operator=(const DeviceRunner&) = delete;

  Device device() const { return device_; }
  bool available() const { return why_unavailable_.empty(); }
  const std::string& why_unavailable() const { return why_unavailable_; }
  const ExecContext& context() const { return context_; }

  // How many times a codec took scratch memory from the runner (ExecContext::scratch).
  int64_t scratch_allocations() const;

  // Encodes `input` (host bytes of a `dtype` tensor of `shape`); the result holds exactly the
  // bytes used.
  absl::StatusOr<std::vector<uint8_t>> Encode(const std::vector<uint8_t>& input, DType dtype,
                                              const std::vector<int64_t>& shape,
                                              const CodecParams& params);

  // Decodes the first `size` bytes of `buffer`, placed in device memory of exactly that size
  // (a read past it is a sanitizer error), into `output`, which is first filled with 0xA5 on
  // the device so that elements the decoder does not write show.
  absl::Status Decode(const std::vector<uint8_t>& buffer, size_t size, DType dtype,
                      const std::vector<int64_t>& shape, std::vector<uint8_t>* output);

  // Encode through the deferred calls, as the runtime takes an encoding whose size the device
  // decides (eb, bitpack) before the host has read the encode's status: EncodeDeferred into
  // room for the bound, PlaceDeferred into a target of `target_capacity` bytes (no arena),
  // GatherDeferred into fresh room for the bound, and DecodeDeferred of the unresolved encoding
  // from there, with a copy of the encode's status, into `unresolved` (filled with 0xA5 first;
  // `failures`: the decode's DeviceStatus::failures). Returns the bytes EncodeDeferred wrote, as
  // many as the status then read back says. Every device buffer is exactly its size (a read
  // past one is a sanitizer error).
  absl::StatusOr<std::vector<uint8_t>> EncodePlaced(const std::vector<uint8_t>& input,
                                                    DType dtype, const std::vector<int64_t>& shape,
                                                    const CodecParams& params,
                                                    size_t target_capacity,
                                                    std::vector<uint8_t>* unresolved,
                                                    uint64_t* failures);

  // Verify() on the first `size` bytes of `buffer`, placed as for Decode.
  absl::StatusOr<Header> Verify(const std::vector<uint8_t>& buffer, size_t size);

 private:
  class Scratch;
  const Device device_;
  std::string why_unavailable_;
  std::unique_ptr<Scratch> scratch_;
  ExecContext context_;
};

}  // namespace actpack::codecs::testing

#endif  // ACTPACK_CODECS_TESTING_DEVICE_RUNNER_H_
