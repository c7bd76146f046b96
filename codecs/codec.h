// The codec interface and the two calls everything else uses: Encode and Decode.
//
// A codec turns a contiguous tensor into a self-describing buffer (format.h) and back. Encoding
// is two-phase, as in nvCOMP: ask MaxEncodedSize, provide that much memory on the tensor's
// device, then Encode writes the buffer (on the GPU, on the context's stream) and returns the
// bytes used. Decode validates the whole header and the checksum before it writes a byte of the
// output; a corrupt or truncated buffer is kDataLoss, never a crash.
//
// Usage:
//   absl::StatusOr<CodecParams> params = ParseCodecSpec("quant2");
//   TensorView input{data, DType::kFloat32, {64, 256}, Device::kCpu};
//   std::vector<uint8_t> buffer(*MaxEncodedSize(input.Spec(), *params));
//   absl::StatusOr<size_t> used = Encode(input, *params, buffer.data(), buffer.size(), {});
//   MutableTensorView output{out_data, DType::kFloat32, {64, 256}, Device::kCpu};
//   absl::Status ok = Decode(buffer.data(), *used, output, {});
#ifndef ACTPACK_CODECS_CODEC_H_
#define ACTPACK_CODECS_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "codecs/dtype.h"
#include "codecs/format.h"
#include "codecs/internal/device_status.h"

namespace actpack::codecs {

enum class Device : uint8_t { kCpu = 0, kCuda = 1 };

// Device memory a codec needs on a GPU besides its output: the few counters a kernel sums a
// checksum or a count into. It comes from the caller's allocator, so that it counts against the
// same budget as the buffers (the runtime passes its budgeted pool); a codec never calls
// cudaMalloc itself. Allocate and Deallocate are ordered on `stream`, as the caching
// allocators' are.
class ScratchAllocator {
 public:
  virtual ~ScratchAllocator() = default;
  virtual absl::StatusOr<void*> Allocate(size_t bytes, void* stream) = 0;
  virtual void Deallocate(void* ptr, size_t bytes, void* stream) = 0;
};

// Where and how a codec runs. `stream` is a cudaStream_t (nullptr: the default stream).
// `scratch` is required for tensors on a GPU.
struct ExecContext {
  Device device = Device::kCpu;
  int device_index = 0;
  void* stream = nullptr;
  ScratchAllocator* scratch = nullptr;
};

// The shape and type of a tensor, without its data.
struct TensorSpec {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  uint64_t numel() const;
};

// A contiguous, row-major tensor in memory on `device`.
struct TensorView {
  const void* data = nullptr;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  Device device = Device::kCpu;
  TensorSpec Spec() const { return {dtype, shape}; }
};

struct MutableTensorView {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  Device device = Device::kCpu;
  TensorSpec Spec() const { return {dtype, shape}; }
};

// How `eb` reads its error bound (the values are written into buffers).
enum class EbMode : uint8_t {
  kAbsolute = 1,  // every value within error_bound
  kRelative = 2,  // within error_bound * (max - min) of the tensor's finite values
};

// Where CPU codecs run their parallel loops. By default one process-wide pool with a thread
// per core (the calling thread is one of them); a host with its own pool installs it
// (SetCpuExecutor) so that codecs and the host never run more threads than there are cores:
// the plugin installs torch's intra-op pool.
class CpuExecutor {
 public:
  virtual ~CpuExecutor() = default;
  // How many tasks run at once.
  virtual int Threads() const = 0;
  // Runs body(0 .. tasks - 1), returning when all have finished.
  virtual void Run(int tasks, const std::function<void(int task)>& body) const = 0;
};

// Installs `executor` (not owned; it must outlive every codec call), or the built-in pool for
// nullptr.
void SetCpuExecutor(const CpuExecutor* executor);

// What to encode with. Fields a codec does not use are ignored by it.
struct CodecParams {
  CodecId codec = CodecId::kIdentity;
  int bits = 2;            // quant, division: bits per value, 1, 2, 4 or 8
  int group_size = 256;    // quant, division: values per (min, step) pair; a multiple of 32
                           // (ParseCodecSpec gives division kDivisionDefaultGroup)
  uint64_t seed = 0;       // stochastic rounding: the same seed gives the same bytes
  DType cast_to = DType::kFloat16;  // cast: the storage type, float16 or bfloat16
  int pool_window = 4;     // pool: values averaged into one stored mean, 2..64
  int block = 8;           // division: the B x B pooling window of the LFC, 2..64
  int keep = 1;            // division_dct: the lowest k x k frequencies kept, 1..32
  EbMode eb_mode = EbMode::kRelative;  // eb: how error_bound is read
  double error_bound = 1e-2;           // eb: the bound, absolute or relative to the range
};

// What a codec's encoder reports back to Encode.
struct PayloadInfo {
  uint64_t payload_size = 0;      // on a GPU where size_on_device: the bound
  uint64_t payload_checksum = 0;  // PayloadChecksum of the bytes written (on a CPU)
  // On a GPU: parameters the data decides are left in the DeviceStatus (eb, bitpack, mask)...
  bool params_on_device = false;
  // ... and the payload's size too (eb, bitpack).
  bool size_on_device = false;
  // On a GPU: the codec's launch wrote the header too (its last block, from the header the
  // encoder completed), so no FinalizeHeader follows.
  bool header_written = false;
};

// What a GPU decode checks of the buffer before it gives the tensor back (kernels.h's
// CheckBuffer): the buffer (`capacity` bytes), the header words the host expects and which of
// them it knows (bit j: word j).
struct DeviceBufferCheck {
  const uint8_t* buffer = nullptr;
  uint64_t capacity = 0;
  HeaderWords expected{};
  uint32_t known = 0;
};

// The header as the words the kernels write and check.
HeaderWords HeaderWordsOf(const Header& header);

class Codec {
 public:
  virtual ~Codec() = default;

  virtual CodecId id() const = 0;
  virtual absl::string_view name() const = 0;

  // OK when this codec can encode `spec` with `params`; kInvalidArgument naming the bad value
  // otherwise (an unsupported dtype, bits outside the allowed set, ...).
  virtual absl::Status CheckEncodable(const TensorSpec& spec, const CodecParams& params) const = 0;

  // An upper bound of the payload (not counting the header) for `spec` under `params`.
  virtual uint64_t MaxPayloadSize(const TensorSpec& spec, const CodecParams& params) const = 0;

  // Writes the codec's parameters into `header->params` and the payload into `payload`, which
  // is on the input's device and holds at least MaxPayloadSize bytes.
  // On the CPU: kFailedPrecondition when the data cannot be encoded by this codec (the caller
  // keeps the tensor some other way), e.g. non-finite values for a codec that cannot keep them
  // exact (Refusal). On a GPU (`status` is the call's DeviceStatus) it only queues kernels,
  // which sum the checksum and the counts Refusal reads into *status and put there what the
  // data decides; the caller reads it when it chooses.
  virtual absl::StatusOr<PayloadInfo> EncodePayload(const TensorView& input,
                                                    const CodecParams& params, Header* header,
                                                    uint8_t* payload, const ExecContext& context,
                                                    DeviceStatus* status) const = 0;

  // kFailedPrecondition naming what this codec could not hold, from an encode's counts (the
  // CPU's, or a GPU's DeviceStatus read back) and its header; OK when it held every value.
  virtual absl::Status Refusal(const DeviceStatus& counts, const Header& header) const;

  // Decodes a payload whose header was validated and whose checksum matched. Must still
  // validate its own parameters and payload size (kDataLoss) before writing any output. On a
  // GPU, `status` holds the buffer check's failures: kernels that validate parameters on the
  // device (ReadsDeviceParams) add theirs, and none writes output while a failure is set. A
  // ChecksOwnBuffer codec's GPU decode is DecodeCheckedPayload (DecodeVerifiedPayload chooses):
  // its DecodePayload is called on the CPU only.
  virtual absl::Status DecodePayload(const Header& header, const uint8_t* payload,
                                     const MutableTensorView& output, const ExecContext& context,
                                     DeviceStatus* status) const = 0;

  // Whether its GPU encode's first launch zeroes the call's DeviceStatus (no other launch of the
  // encode having summed into it yet), so that the deferred encode queues no memset of its own.
  virtual bool EncodeZeroesStatus() const { return false; }

  // Whether its GPU decode checks the buffer in the launch that decodes it (DecodeCheckedPayload),
  // so that a decode of a buffer whose parameters the host knows needs no CheckBuffer launch.
  virtual bool ChecksOwnBuffer() const { return false; }

  // DecodePayload on a GPU that also checks the buffer (CheckBuffer's checks, failures into
  // status->failures) in the same launch; Poison follows it. For ChecksOwnBuffer codecs.
  virtual absl::Status DecodeCheckedPayload(const Header& header, const DeviceBufferCheck& check,
                                            const MutableTensorView& output,
                                            const ExecContext& context,
                                            DeviceStatus* status) const {
    return absl::UnimplementedError(
        absl::StrCat("actpack: ", name(), " does not check its buffer while decoding"));
  }

  // The decode of a verified payload (its checksum matched) on `output`'s device: on a GPU a
  // ChecksOwnBuffer codec's DecodeCheckedPayload, with a check that passes; DecodePayload
  // otherwise.
  absl::Status DecodeVerifiedPayload(const Header& header, const uint8_t* payload,
                                     const MutableTensorView& output, const ExecContext& context,
                                     DeviceStatus* status) const;

  // Whether a decode gives back every bit of what was encoded (identity, mask, bitpack): such a
  // codec has no error to measure and is never one of auto's rungs.
  virtual bool lossless() const = 0;

  // The specs `codec="auto"` may choose for a saved tensor from this codec (none: auto never
  // picks it). The session's candidates are these, gathered from the registry
  // (runtime::SessionOptions::DefaultLadder).
  virtual std::vector<std::string> AutoSpecs() const { return {}; }

  // Whether its GPU decoder reads the parameters the data decided on the device (from the
  // buffer's header, or the encode's DeviceStatus) and checks them there, so that the host need
  // not know them: DecodeUnresolvedPayload.
  virtual bool ReadsDeviceParams() const { return false; }

  // DecodePayload on a GPU of a deferred encoding the host has not resolved (ReadsDeviceParams):
  // `header` holds 0 where the device decided (the parameters, and the payload's size where the
  // device decided that too); `status` holds what the encode left in its own (it is that status
  // or a copy of it); `capacity` is the bytes at `payload`. The default is
  // DecodeVerifiedPayload, for the codecs whose kernels read the buffer's header in device
  // memory.
  virtual absl::Status DecodeUnresolvedPayload(const Header& header, const uint8_t* payload,
                                               uint64_t capacity, const MutableTensorView& output,
                                               const ExecContext& context,
                                               DeviceStatus* status) const {
    static_cast<void>(capacity);
    return DecodeVerifiedPayload(header, payload, output, context, status);
  }
};

// kHeaderSize + the codec's MaxPayloadSize; errors as Codec::CheckEncodable.
absl::StatusOr<size_t> MaxEncodedSize(const TensorSpec& spec, const CodecParams& params);

// Encodes `input` into `out` (on the input's device, `capacity` bytes); returns the bytes used.
absl::StatusOr<size_t> Encode(const TensorView& input, const CodecParams& params, uint8_t* out,
                              size_t capacity, const ExecContext& context);

// Reads and validates the header of an encoded buffer in memory on `context.device`.
absl::StatusOr<Header> ReadHeader(const uint8_t* buffer, size_t size, const ExecContext& context);

// The validated header of a buffer whose checksum matches: what to allocate before Decode when
// the output's shape comes from the buffer (a corrupt shape is then kDataLoss, not a huge
// allocation).
absl::StatusOr<Header> Verify(const uint8_t* buffer, size_t size, const ExecContext& context);

// Decodes a buffer into `output`, whose dtype and shape must match the buffer's.
absl::Status Decode(const uint8_t* buffer, size_t size, const MutableTensorView& output,
                    const ExecContext& context);

// Decode for a buffer that Verify accepted, with the header it returned: the checksum is not
// computed again (it reads the whole payload).
absl::Status DecodeVerified(const Header& verified, const uint8_t* buffer,
                            const MutableTensorView& output, const ExecContext& context);

}  // namespace actpack::codecs

#endif  // ACTPACK_CODECS_CODEC_H_
