// Contenders of perf/weightload: each reads a model's files from disk into memory one way
// and reports bytes and seconds; plus page-cache eviction (checked with mincore) and a
// child-process runner for fio and dd. Used by baton-perf-weightload's single thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "weightcache/model_files.h"
#include "weightcache/weight_cache.h"

namespace baton::perf {

struct Sample {
  uint64_t bytes = 0;
  double seconds = 0;
  double gbps() const { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0; }
};

struct CommandResult {
  int exit_code = -1;
  std::string out, err;
  double seconds = 0;
};

struct BatonSample {
  Sample fill;
  Sample end_to_end;
  LoadStats stats;
  std::vector<std::string> warnings;
  bool huge_pages = false, locked = false;
};

double SecondsSince(TimePoint start);
// The fraction of the files' pages in the page cache (mincore), without evicting anything.
Result<double> ResidentFraction(const std::vector<std::string>& files);
// Drops every file's pages from the page cache and returns the fraction still resident.
Result<double> Evict(const std::vector<std::string>& files);
// Runs argv (looked up in PATH) with stdout and stderr captured; stdin is /dev/null.
Result<CommandResult> RunCommand(const std::vector<std::string>& argv);
// The fio command line for one job over all `files`.
std::vector<std::string> FioCommand(const std::string& fio, const std::vector<std::string>& files,
                                    bool fixed_buffers);
Result<Sample> RunFio(const std::vector<std::string>& command);
Result<Sample> RunDd(const std::vector<std::string>& files, const std::vector<uint64_t>& sizes);
// Checks sampled ranges of every tensor against the generator's values (for models written
// by baton-mkmodel); nullopt when the directory is not such a model, "" when all match.
std::optional<std::string> VerifyAgainstGenerator(const WeightCache& cache, const std::string& dir);
Result<BatonSample> RunBaton(const std::string& dir, std::optional<std::string>* verified);
Result<Sample> RunRead(const std::vector<std::string>& files, uint8_t* dest, uint64_t capacity);
Result<Sample> RunMmap(const ModelFiles& model, uint8_t* dest);

}  // namespace baton::perf
