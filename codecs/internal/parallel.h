// Splits [0, n) into contiguous chunks and runs them on the codecs' CPU executor (codec.h,
// SetCpuExecutor): torch's intra-op pool inside the plugin, else one process-wide pool of a
// thread per core, the calling thread included. Small ranges (fewer than 2 * grain items) run
// inline on the calling thread.
#ifndef ACTPACK_CODECS_INTERNAL_PARALLEL_H_
#define ACTPACK_CODECS_INTERNAL_PARALLEL_H_

#include <cstdint>
#include <functional>

namespace actpack::codecs::internal {

// Calls fn(chunk_index, begin, end) once per chunk; returns the number of chunks, at most
// MaxParallelChunks(). No result may depend on where the chunk boundaries fall (they depend
// on the executor's thread count).
int ParallelFor(int64_t n, int64_t grain,
                const std::function<void(int chunk, int64_t begin, int64_t end)>& fn);

// An upper bound of the chunks ParallelFor uses, to size per-chunk accumulators.
constexpr int MaxParallelChunks() { return 64; }

}  // namespace actpack::codecs::internal

#endif  // ACTPACK_CODECS_INTERNAL_PARALLEL_H_
