#include "codecs/internal/parallel.h"

#include <algorithm>
#include <thread>
#include <vector>

namespace actpack::codecs::internal {

int MaxParallelChunks() {
  static const int chunks = std::max(1u, std::min(64u, std::thread::hardware_concurrency()));
  return chunks;
}

int ParallelFor(int64_t n, int64_t grain,
                const std::function<void(int chunk, int64_t begin, int64_t end)>& fn) {
  if (n <= 0) return 0;
  grain = std::max<int64_t>(grain, 1);
  const int chunks =
      static_cast<int>(std::min<int64_t>(MaxParallelChunks(), std::max<int64_t>(1, n / grain)));
  if (chunks == 1) {
    fn(0, 0, n);
    return 1;
  }
  const int64_t per_chunk = (n + chunks - 1) / chunks;
  std::vector<std::thread> workers;
  workers.reserve(chunks - 1);
  for (int c = 1; c < chunks; ++c) {
    const int64_t begin = std::min(n, c * per_chunk);
    const int64_t end = std::min(n, begin + per_chunk);
    workers.emplace_back([&fn, c, begin, end] { fn(c, begin, end); });
  }
  fn(0, 0, std::min(n, per_chunk));
  for (std::thread& worker : workers) worker.join();
  return chunks;
}

}  // namespace actpack::codecs::internal
