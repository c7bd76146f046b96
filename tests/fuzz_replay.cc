#include "tests/fuzz_replay.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace actpack::fuzz {

std::vector<std::string> ReadCorpus(const std::string& dir) {
  std::vector<std::filesystem::path> paths;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) paths.push_back(entry.path());
  std::sort(paths.begin(), paths.end());  // directory order is not stable; the mutations must be
  std::vector<std::string> corpus;
  for (const auto& path : paths) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    corpus.push_back(bytes.str());
  }
  return corpus;
}

Mutator::Mutator(uint64_t seed, std::vector<std::string> corpus, std::vector<std::string> tokens)
    : rng_(seed), corpus_(std::move(corpus)), tokens_(std::move(tokens)) {}

std::string Mutator::Next() {
  std::string s = corpus_[Pick(corpus_.size())];
  const int edits = 1 + static_cast<int>(Pick(4));
  for (int e = 0; e < edits; ++e) {
    const size_t at = s.empty() ? 0 : Pick(s.size() + 1);
    switch (Pick(7)) {
      case 0:  // flip a bit
        if (!s.empty()) s[Pick(s.size())] ^= static_cast<char>(1u << Pick(8));
        break;
      case 1:  // insert a random byte
        s.insert(at, 1, static_cast<char>(Pick(256)));
        break;
      case 2:  // delete a short range
        if (!s.empty()) s.erase(Pick(s.size()), 1 + Pick(8));
        break;
      case 3:  // insert a dictionary token
        if (!tokens_.empty()) s.insert(at, tokens_[Pick(tokens_.size())]);
        break;
      case 4: {  // splice in a piece of another seed
        const std::string& other = corpus_[Pick(corpus_.size())];
        s.insert(at, other.substr(Pick(other.size() + 1), Pick(64)));
        break;
      }
      case 5:  // truncate
        s.resize(at);
        break;
      default: {  // duplicate a range
        if (s.empty()) break;
        const size_t from = Pick(s.size());
        s.insert(at, s.substr(from, 1 + Pick(32)));
        break;
      }
    }
  }
  return s;
}

}  // namespace actpack::fuzz
