#include "codecs/internal/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "codecs/codec.h"

namespace actpack::codecs {
namespace {

// Chunks per thread: more chunks than threads, claimed as threads come free, even out a core
// that another process slows down.
constexpr int kChunksPerThread = 4;

// True while this thread runs chunks of the built-in pool: a ParallelFor inside a chunk runs
// inline instead of waiting for the pool it occupies.
thread_local bool in_pool_task = false;

// The built-in executor: hardware_concurrency - 1 workers that sleep on a condition variable
// between jobs (never spinning: a codec must not add runnable threads beyond the cores) and the
// calling thread, which runs chunks too. One job at a time; a second caller meanwhile runs its
// chunks inline.
class ThreadPool final : public CpuExecutor {
 public:
  ThreadPool() : threads_(static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))) {
    for (int i = 1; i < threads_; ++i) std::thread([this] { WorkerLoop(); }).detach();
  }

  int Threads() const override { return threads_; }

  void Run(int tasks, const std::function<void(int)>& body) const override {
    std::unique_lock<std::mutex> job_lock(job_mu_, std::try_to_lock);
    if (in_pool_task || !job_lock.owns_lock() || threads_ == 1) {
      for (int t = 0; t < tasks; ++t) body(t);
      return;
    }
    Job job{&body, tasks};
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &job;
      ++generation_;
    }
    work_cv_.notify_all();
    Drain(job);
    std::unique_lock<std::mutex> lock(mu_);
    job_ = nullptr;  // a worker waking late finds nothing to do
    done_cv_.wait(lock, [this] { return busy_ == 0; });
  }

 private:
  struct Job {
    const std::function<void(int)>* body;
    int tasks;
    std::atomic<int> next{0};
  };

  static void Drain(Job& job) {
    in_pool_task = true;
    for (int t = job.next.fetch_add(1); t < job.tasks; t = job.next.fetch_add(1)) (*job.body)(t);
    in_pool_task = false;
  }

  void WorkerLoop() const {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      work_cv_.wait(lock, [&] { return generation_ != seen; });
      seen = generation_;
      Job* job = job_;
      if (job == nullptr) continue;
      ++busy_;
      lock.unlock();
      Drain(*job);
      lock.lock();
      if (--busy_ == 0) done_cv_.notify_all();
    }
  }

  const int threads_;
  mutable std::mutex job_mu_;  // held by the caller whose job the workers run
  mutable std::mutex mu_;
  mutable std::condition_variable work_cv_;
  mutable std::condition_variable done_cv_;
  mutable Job* job_ = nullptr;
  mutable uint64_t generation_ = 0;
  mutable int busy_ = 0;  // workers inside the current job
};

const CpuExecutor* DefaultExecutor() {
  static const ThreadPool* const pool = new ThreadPool();
  return pool;
}

std::atomic<const CpuExecutor*> executor{nullptr};

const CpuExecutor& CurrentExecutor() {
  const CpuExecutor* installed = executor.load(std::memory_order_acquire);
  return installed != nullptr ? *installed : *DefaultExecutor();
}

}  // namespace

void SetCpuExecutor(const CpuExecutor* installed) {
  executor.store(installed, std::memory_order_release);
}

namespace internal {

int ParallelFor(int64_t n, int64_t grain,
                const std::function<void(int chunk, int64_t begin, int64_t end)>& fn) {
  if (n <= 0) return 0;
  grain = std::max<int64_t>(grain, 1);
  if (n < 2 * grain) {
    fn(0, 0, n);
    return 1;
  }
  const CpuExecutor& pool = CurrentExecutor();
  const int threads = std::max(1, pool.Threads());
  if (threads == 1) {
    fn(0, 0, n);
    return 1;
  }
  const int64_t wanted = std::min<int64_t>({MaxParallelChunks(), n / grain,
                                            int64_t{threads} * kChunksPerThread});
  const int64_t per_chunk = (n + wanted - 1) / wanted;
  const int chunks = static_cast<int>((n + per_chunk - 1) / per_chunk);
  pool.Run(chunks, [&](int c) {
    const int64_t begin = c * per_chunk;
    fn(c, begin, std::min(n, begin + per_chunk));
  });
  return chunks;
}

}  // namespace internal
}  // namespace actpack::codecs
