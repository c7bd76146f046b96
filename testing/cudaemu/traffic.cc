// Memory traffic per kernel, from the accesses the race checker sees (control.h's
// KernelTraffic): what Nsight Compute's memory workload analysis reports, counted instead of
// sampled.
//
// A GPU issues one request per warp-wide memory instruction. Here the lanes of a warp run one
// after another, so a lane's k-th execution of an access site (its return address) is paired
// with the other lanes' k-th: together they are one request. Per request: the bytes the lanes
// asked for, the 32-byte sectors they touched, and the fewest sectors that hold the distinct
// bytes (a contiguous, aligned request's count); for shared memory, the wavefronts its 32 banks
// of 4-byte words need. Per launch, the distinct sectors touched are what DRAM must move at
// least (every reuse within the launch caught by the caches).
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "testing/cudaemu/internal.h"

namespace cudaemu::internal {
namespace {

constexpr uint64_t kSector = 32;

struct RequestKey {
  uint32_t warp;
  const void* pc;
  uint32_t occurrence;
  bool operator==(const RequestKey& o) const {
    return warp == o.warp && pc == o.pc && occurrence == o.occurrence;
  }
};
struct RequestKeyHash {
  size_t operator()(const RequestKey& k) const {
    return std::hash<const void*>()(k.pc) ^ (size_t{k.warp} << 40) ^
           (size_t{k.occurrence} * 0x9e3779b97f4a7c15ull);
  }
};

struct Request {
  bool global = true;
  bool write = false;
  std::vector<std::pair<uintptr_t, uint32_t>> accesses;  // (address, bytes)
};

class Recorder final : public TrafficRecorder {
 public:
  bool recording() const override { return recording_; }
  bool check_races() const override { return check_races_; }

  void Start(bool check_races) override {
    recording_ = true;
    check_races_ = check_races;
    kernels_.clear();
    Reset();
  }

  std::map<std::string, KernelTraffic> Stop() override {
    Flush();
    recording_ = false;
    check_races_ = true;
    return std::move(kernels_);
  }

  void SetInput(uintptr_t lo, uintptr_t hi) override {
    input_lo_ = lo;
    input_hi_ = hi;
  }

  void BlockBegin(const KernelLaunch& launch) override {
    if (!recording_) return;
    FlushBlock();
    if (launch.id != launch_id_) {
      FlushLaunch();
      launch_id_ = launch.id;
      current_ = &kernels_[launch.name];
      ++current_->launches;
    }
  }

  void KernelEnd() override {
    if (!recording_) return;
    Flush();
  }

  // A copy engine's transfer: whole sectors, one request per 128 bytes (as a kernel's coalesced
  // copy would issue them).
  void Transfer(const char* name, uint64_t read, uint64_t written) override {
    if (!recording_) return;
    KernelTraffic& t = kernels_[name];
    ++t.launches;
    for (uint64_t bytes : {read, written}) {
      const uint64_t sectors = (bytes + kSector - 1) / kSector;
      t.requests += (bytes + 127) / 128;
      t.bytes += bytes;
      t.sectors += sectors;
      t.ideal_sectors += sectors;
      t.unique_sectors += sectors;
    }
    t.read_bytes += read;
  }

  void Access(const ThreadContext& thread, uintptr_t address, size_t bytes, bool write,
              bool global, const void* pc) override {
    if (!recording_ || current_ == nullptr) return;
    uint32_t& seen = occurrences_[{thread.thread, pc}];
    Request& request = requests_[RequestKey{thread.thread / 32, pc, seen++}];
    request.global = global;
    request.accesses.emplace_back(address, static_cast<uint32_t>(bytes));
    request.write = write;
    if (global) {
      current_->bytes += bytes;
      if (!write) current_->read_bytes += bytes;
      for (uint64_t s = address / kSector; s <= (address + bytes - 1) / kSector; ++s) {
        launch_sectors_.insert(s);
      }
    }
  }

 private:
  struct PairHash {
    size_t operator()(const std::pair<uint32_t, const void*>& p) const {
      return std::hash<const void*>()(p.second) ^ (size_t{p.first} << 32);
    }
  };

  void Reset() {
    current_ = nullptr;
    launch_id_ = 0;
    requests_.clear();
    occurrences_.clear();
    launch_sectors_.clear();
  }

  void Flush() {
    FlushBlock();
    FlushLaunch();
    current_ = nullptr;
    launch_id_ = 0;
  }

  void FlushLaunch() {
    if (current_ != nullptr) current_->unique_sectors += launch_sectors_.size();
    launch_sectors_.clear();
  }

  // Turns the block's requests into counts.
  void FlushBlock() {
    if (current_ != nullptr) {
      for (auto& [key, request] : requests_) Count(request);
    }
    requests_.clear();
    occurrences_.clear();
  }

  void Count(Request& request) {
    std::sort(request.accesses.begin(), request.accesses.end());
    request.accesses.erase(std::unique(request.accesses.begin(), request.accesses.end()),
                           request.accesses.end());
    if (!request.global) {
      // 32 banks of 4-byte words: the most distinct words any one bank must serve, and at
      // least one wavefront per 128 bytes asked for.
      std::unordered_map<uint32_t, std::unordered_set<uintptr_t>> banks;
      uint64_t distinct = 0;
      for (const auto& [address, bytes] : request.accesses) {
        distinct += bytes;
        for (uintptr_t w = address / 4; w <= (address + bytes - 1) / 4; ++w) {
          banks[static_cast<uint32_t>(w % 32)].insert(w);
        }
      }
      uint64_t wavefronts = (distinct + 127) / 128;
      for (const auto& [bank, words] : banks) wavefronts = std::max<uint64_t>(wavefronts, words.size());
      ++current_->shared_requests;
      current_->shared_wavefronts += wavefronts;
      return;
    }
    std::unordered_set<uint64_t> sectors;
    uint64_t distinct = 0;
    uintptr_t covered = 0;  // distinct bytes: sorted accesses, overlaps counted once
    for (const auto& [address, bytes] : request.accesses) {
      const uintptr_t start = std::max<uintptr_t>(address, covered);
      if (address + bytes > start) distinct += address + bytes - start;
      covered = std::max<uintptr_t>(covered, address + bytes);
      for (uint64_t s = address / kSector; s <= (address + bytes - 1) / kSector; ++s) {
        sectors.insert(s);
      }
    }
    ++current_->requests;
    current_->sectors += sectors.size();
    if (!request.write) {
      // Passes over the input, as the sectors read from it: a broadcast read counts once.
      for (uint64_t sector : sectors) {
        if (sector * kSector >= input_lo_ && sector * kSector < input_hi_) {
          current_->input_read_bytes += kSector;
        }
      }
    }
    current_->ideal_sectors += (distinct + kSector - 1) / kSector;
  }

  bool recording_ = false;
  bool check_races_ = true;
  uintptr_t input_lo_ = 0, input_hi_ = 0;
  std::map<std::string, KernelTraffic> kernels_;
  KernelTraffic* current_ = nullptr;
  uint64_t launch_id_ = 0;
  std::unordered_map<RequestKey, Request, RequestKeyHash> requests_;
  std::unordered_map<std::pair<uint32_t, const void*>, uint32_t, PairHash> occurrences_;
  std::unordered_set<uint64_t> launch_sectors_;
};

[[maybe_unused]] const bool registered = [] {
  static auto* recorder = new Recorder;
  SetTrafficRecorder(recorder);
  return true;
}();

}  // namespace
}  // namespace cudaemu::internal
