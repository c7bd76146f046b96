// Memory the session packs into: one encoded tensor's buffer, and where buffers come from.
#ifndef ACTPACK_RUNTIME_BUFFER_H_
#define ACTPACK_RUNTIME_BUFFER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "codecs/codec.h"

namespace actpack::runtime {

// Memory that holds one encoded tensor. The plugin backs it with a torch tensor, so the bytes
// come from (and are counted by) the same allocator as the rest of the step.
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual uint8_t* data() = 0;
  virtual size_t size() const = 0;
  // Gives back the bytes past `bytes` (a variable-size encoding used less than its bound).
  // Buffers that cannot shrink keep their size; data() may change.
  virtual absl::Status ShrinkTo(size_t bytes) { return absl::OkStatus(); }
  // Tells the buffer's allocator that `stream` (a cudaStream_t) uses it too, so that its memory
  // is not handed out again before that stream's work is done (torch's record_stream). Host
  // memory has no streams.
  virtual absl::Status RecordStream(void* stream) { return absl::OkStatus(); }
};

using BufferFactory = std::function<absl::StatusOr<std::unique_ptr<Buffer>>(
    size_t bytes, const codecs::ExecContext& context)>;

}  // namespace actpack::runtime

#endif  // ACTPACK_RUNTIME_BUFFER_H_
