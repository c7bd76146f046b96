// Replaying libFuzzer targets under gtest, for builds without clang's fuzzer runtime: read a
// seed corpus, then mutate it deterministically (byte edits, dictionary tokens, splices,
// truncation), so `bazel test` exercises every fuzz target on every run and a failure
// reproduces from the seed alone. The real fuzzing commands are in each target's header.
//
// Usage (in a *_fuzz.cc built with -D..._REPLAY):
//   const std::vector<std::string> corpus = actpack::fuzz::ReadCorpus("codecs/testdata/...");
//   actpack::fuzz::Mutator mutator(/*seed=*/1, corpus, {"APK1", "\xff\xff"});
//   for (int i = 0; i < 20000; ++i) RunOne(mutator.Next());
#ifndef ACTPACK_TESTS_FUZZ_REPLAY_H_
#define ACTPACK_TESTS_FUZZ_REPLAY_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace actpack::fuzz {

// The files of `dir` (relative to the runfiles root under Bazel), in name order.
std::vector<std::string> ReadCorpus(const std::string& dir);

class Mutator {
 public:
  Mutator(uint64_t seed, std::vector<std::string> corpus, std::vector<std::string> tokens);

  // A seed from the corpus with 1 to 4 random edits.
  std::string Next();

 private:
  size_t Pick(size_t n) { return static_cast<size_t>(rng_() % n); }

  std::mt19937_64 rng_;
  std::vector<std::string> corpus_;
  std::vector<std::string> tokens_;
};

}  // namespace actpack::fuzz

#endif  // ACTPACK_TESTS_FUZZ_REPLAY_H_
