// baton-perf-weightload: how fast a model's safetensors files get from disk into memory,
// Baton's loader against the alternatives, side by side on the same files in one run.
//
//   baton-perf-weightload --model DIR [--rounds N] [--out DIR] [--fio PATH]
//
// The driver runs as every perf driver does (perf/driver_main.h): `--help`; a run guard that
// stops fio and dd however the run ends (SIGINT, SIGTERM, a crash); `--out` created and
// checked before the first round (exit 1 with the JSON error when it cannot be written); a
// model that cannot be read is {"ok": false, "error": ...} and exit 1.
//
// Each round runs, in this order, with the page cache evicted before each:
//   fio    fio with io_uring, O_DIRECT, queue depth 32, 1 MiB blocks, registered buffers
//          (--fixedbufs, as Baton's loader uses; without them each request pins its pages
//          and some virtual disks lose half their speed), one job over all the files: the
//          best a generic reader gets from this disk. When fio cannot register buffers (a
//          small RLIMIT_MEMLOCK), it runs without and the JSON says so
//          (fio_registered_buffers false, fio_fixedbufs_error why). When fio fails either way
//          (a model smaller than its 1 MiB blocks, fio missing), fio_error says why and
//          fio_registered_buffers is null.
//   dd     dd iflag=direct bs=4M, one file after the other
//   baton  WeightCache::Load into a fresh PinnedArena; baton_gbps is the loader's fill rate
//          (LoadStats), baton_e2e_gbps includes validation and arena creation
//   read   buffered read() of each whole file into a heap buffer
//   mmap   mmap of each file and memcpy of each tensor into a heap buffer (what common
//          safetensors loaders do)
// read and mmap share one heap buffer, allocated and faulted in once before the first
// round; Baton's arena is created and faulted in before its clock starts (not so for
// baton_e2e). The disk's speed drifts between runs, so the contenders are interleaved and
// medians reported.
// Eviction is fdatasync + posix_fadvise(DONTNEED), checked with mincore; when pages stay
// resident the round says so and `evicted` is false. GB/s = 1e9 bytes/s. The last line of
// stdout is one JSON object. Single-threaded driver.
#include <fcntl.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/io/unique_fd.h"
#include "base/status.h"
#include "perf/driver_main.h"
#include "perf/weights/weightload_contenders.h"
#include "standby/mkmodel/model_layout.h"
#include "weightcache/model_files.h"
#include "weightcache/weight_cache.h"

extern char** environ;

namespace baton {
namespace {

using namespace ::baton::perf;  // NOLINT: the contenders are this driver's vocabulary

using nlohmann::json;

constexpr char kName[] = "baton-perf-weightload";
constexpr char kUsage[] =
    "usage: baton-perf-weightload --model DIR [--rounds N] [--out DIR] [--fio PATH]\n"
    "  --model  a safetensors model folder (baton-mkmodel writes one)\n"
    "  --rounds rounds of every contender, medians reported (default 5)\n"
    "  --out    also write weightload.json into DIR\n"
    "  --fio    the fio program (default fio on PATH)\n";
constexpr double kMaxResidentFraction = 0.01;
// The acceptance targets: within 10% of fio, at least 3x mmap + memcpy (medians).
constexpr double kTargetVsFio = 0.9;
constexpr double kTargetVsMmap = 3.0;
const char* const kContenders[] = {"fio", "dd", "baton", "read", "mmap"};

struct Flags {
  std::string model;
  std::string bin;  // RunPerfDriver's; unused
  std::string out;
  std::string fio = "fio";
  int rounds = 5;
};

// ---- report ------------------------------------------------------------------------------

struct Series {
  std::vector<double> gbps;
  std::vector<std::string> errors;
  double Median() const {
    if (gbps.empty()) return 0;
    std::vector<double> v = gbps;
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  }
  json Summary() const {
    if (gbps.empty()) return {{"median_gbps", nullptr}, {"errors", errors}};
    return {{"median_gbps", Median()},
            {"min_gbps", *std::min_element(gbps.begin(), gbps.end())},
            {"max_gbps", *std::max_element(gbps.begin(), gbps.end())},
            {"samples_gbps", gbps},
            {"errors", errors}};
  }
};

json MedianOrNull(const Series& s) { return s.gbps.empty() ? json(nullptr) : json(s.Median()); }

json Ratio(const Series& a, const Series& b) {
  if (a.gbps.empty() || b.gbps.empty() || b.Median() <= 0) return nullptr;
  return a.Median() / b.Median();
}

// The median of per-round ratios, over rounds where both ran.
json PairedRatio(const std::vector<std::map<std::string, double>>& rounds, const char* a,
                 const char* b) {
  Series ratios;
  for (const auto& r : rounds) {
    if (r.count(a) && r.count(b) && r.at(b) > 0) ratios.gbps.push_back(r.at(a) / r.at(b));
  }
  return ratios.gbps.empty() ? json(nullptr) : json(ratios.Median());
}

std::string ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (i + 1 >= argc) return "unknown or incomplete argument: " + std::string(arg);
    const std::string_view v = argv[++i];
    if (arg == "--model") {
      f->model = v;
    } else if (arg == "--out") {
      f->out = v;
    } else if (arg == "--fio") {
      f->fio = v;
    } else if (arg == "--rounds") {
      auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), f->rounds);
      if (ec != std::errc() || p != v.data() + v.size() || f->rounds < 1 || f->rounds > 1000) {
        return "--rounds: not a number in [1, 1000]: " + std::string(v);
      }
    } else {
      return "unknown argument: " + std::string(arg);
    }
  }
  return f->model.empty() ? "--model DIR is required" : "";
}

// One run: the model's files, the shared destination buffer and every round's numbers.
class Bench {
 public:
  explicit Bench(const Flags& flags) : flags_(flags) {}

  Status Setup();
  void RunRound(int round);
  void PrintTable() const;
  json Result() const;
  bool failed() const { return series_.at("baton").gbps.empty() || wrong_data(); }

 private:
  bool wrong_data() const { return verified_ && !verified_->empty(); }
  bool EvictBefore(const char* name);
  baton::Result<Sample> RunContender(const std::string& name);
  baton::Result<Sample> RunFioContender();

  const Flags& flags_;
  std::optional<ModelFiles> model_;
  std::vector<std::string> files_;
  std::vector<uint64_t> sizes_;
  uint64_t total_ = 0;
  std::vector<std::string> fio_command_;
  std::vector<std::string> fio_plain_command_;
  bool fio_fixed_buffers_ = true;    // false once fio ran without them after failing with them
  bool fio_ran_ = false;             // fio measured at least once
  std::string fio_error_;            // the last failure of fio with and without --fixedbufs
  std::string fio_fixedbufs_error_;  // why registered buffers were given up
  std::unique_ptr<uint8_t[]> dest_;
  std::map<std::string, Series> series_;
  std::vector<std::map<std::string, double>> rounds_;
  std::optional<std::string> verified_;
  BatonSample last_baton_;
  bool evicted_ = true;
  double worst_resident_ = 0;
  double load_at_start_ = 0;
};

// The 1-minute load average: the buffered contenders need CPU, so a busy machine slows them.
double LoadAverage() {
  double load[1] = {0};
  return ::getloadavg(load, 1) == 1 ? load[0] : 0;
}

std::string Join(const std::vector<std::string>& words) {
  std::string text;
  for (const std::string& w : words) text += (text.empty() ? "" : " ") + w;
  return text;
}

Status Bench::Setup() {
  BATON_ASSIGN_OR_RETURN(model_, ModelFiles::Open(flags_.model));
  for (const SafetensorsIndex& s : model_->shards()) {
    files_.push_back(s.path());
    sizes_.push_back(s.file_size());
  }
  total_ = model_->total_file_bytes();
  std::printf("model %s: %zu files, %llu bytes (%.2f GiB), %d rounds\n", flags_.model.c_str(),
              files_.size(), static_cast<unsigned long long>(total_), total_ / 1073741824.0,
              flags_.rounds);
  if (total_ < (2ull << 30)) std::printf("note: the model is smaller than 2 GiB\n");
  fio_command_ = FioCommand(flags_.fio, files_, true);
  fio_plain_command_ = FioCommand(flags_.fio, files_, false);
  std::printf("fio: %s\n", Join(fio_command_).c_str());
  std::printf("dd:  dd if=FILE of=/dev/null iflag=direct bs=4M status=none (each file)\n");
  std::fflush(stdout);
  // One destination for read and mmap, allocated and faulted in before any clock starts.
  dest_.reset(new (std::nothrow) uint8_t[total_]);
  if (!dest_) return ResourceExhausted("cannot allocate " + std::to_string(total_) + " bytes");
  std::memset(dest_.get(), 1, total_);
  for (const char* name : kContenders) series_[name];
  series_["baton_e2e"];
  load_at_start_ = LoadAverage();
  return OkStatus();
}

bool Bench::EvictBefore(const char* name) {
  baton::Result<double> resident = Evict(files_);
  if (resident.ok()) worst_resident_ = std::max(worst_resident_, *resident);
  if (resident.ok() && *resident <= kMaxResidentFraction) return true;
  evicted_ = false;
  const std::string why = resident.ok() ? std::to_string(*resident * 100) + "% still resident"
                                        : resident.status().ToString();
  std::fprintf(stderr, "weightload: page cache eviction before %s did not take: %s\n", name,
               why.c_str());
  return false;
}

baton::Result<Sample> Bench::RunContender(const std::string& name) {
  if (name == "fio") return RunFioContender();
  if (name == "dd") return RunDd(files_, sizes_);
  if (name == "read") return RunRead(files_, dest_.get(), total_);
  if (name == "mmap") return RunMmap(*model_, dest_.get());
  baton::Result<BatonSample> b = RunBaton(flags_.model, &verified_);
  if (!b.ok()) return b.status();
  last_baton_ = *b;
  series_["baton_e2e"].gbps.push_back(b->end_to_end.gbps());
  return b->fill;
}

// fio's own words: the message without trailing blanks.
std::string FioMessage(const Status& s) {
  std::string m = s.message();
  while (!m.empty() && std::isspace(static_cast<unsigned char>(m.back()))) m.pop_back();
  return m;
}

// With registered buffers while they work; when fio fails with them, once more without: if
// that works, the buffers were the trouble (a small RLIMIT_MEMLOCK) and fio runs without from
// now on; if not, fio fails for another reason (fio_error), and the next round tries again.
baton::Result<Sample> Bench::RunFioContender() {
  if (fio_fixed_buffers_) {
    baton::Result<Sample> fixed = RunFio(fio_command_);
    if (fixed.ok()) {
      fio_ran_ = true;
      return fixed;
    }
    if (fixed.status().code() == StatusCode::kUnavailable) {  // not installed
      fio_error_ = FioMessage(fixed.status());
      return fixed;
    }
    baton::Result<Sample> plain = RunFio(fio_plain_command_);
    if (!plain.ok()) {
      fio_error_ = FioMessage(plain.status());
      return plain;
    }
    std::fprintf(stderr,
                 "weightload: fio with registered buffers failed (%s); running fio without "
                 "--fixedbufs from now on\n",
                 fixed.status().ToString().c_str());
    fio_fixed_buffers_ = false;
    fio_fixedbufs_error_ = FioMessage(fixed.status());
    fio_ran_ = true;
    return plain;
  }
  baton::Result<Sample> plain = RunFio(fio_plain_command_);
  if (plain.ok()) {
    fio_ran_ = true;
  } else {
    fio_error_ = FioMessage(plain.status());
  }
  return plain;
}

void Bench::RunRound(int round) {
  std::map<std::string, double> row;
  std::string line = "round " + std::to_string(round) + "/" + std::to_string(flags_.rounds) + ":";
  bool evicted = true;
  for (const char* name : kContenders) {
    evicted = EvictBefore(name) && evicted;
    const baton::Result<Sample> sample = RunContender(name);
    char cell[96];
    if (sample.ok()) {
      series_[name].gbps.push_back(sample->gbps());
      row[name] = sample->gbps();
      std::snprintf(cell, sizeof(cell), " %s %.2f", name, sample->gbps());
    } else {
      series_[name].errors.push_back(sample.status().ToString());
      std::fprintf(stderr, "weightload: %s failed: %s\n", name, sample.status().ToString().c_str());
      std::snprintf(cell, sizeof(cell), " %s FAILED", name);
    }
    line += cell;
    if (std::string(name) == "baton" && sample.ok()) {
      std::snprintf(cell, sizeof(cell), " (e2e %.2f)", series_["baton_e2e"].gbps.back());
      line += cell;
    }
  }
  rounds_.push_back(row);
  std::printf("%s GB/s%s\n", line.c_str(), evicted ? "" : " [page cache not evicted]");
  std::fflush(stdout);
}

void Bench::PrintTable() const {
  std::printf("%-10s %8s %8s %8s  (GB/s over %d rounds)\n", "contender", "median", "min", "max",
              flags_.rounds);
  for (const char* name : {"fio", "dd", "baton", "baton_e2e", "read", "mmap"}) {
    const std::vector<double>& v = series_.at(name).gbps;
    if (v.empty()) {
      std::printf("%-10s %8s\n", name, "failed");
    } else {
      std::printf("%-10s %8.2f %8.2f %8.2f\n", name, series_.at(name).Median(),
                  *std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end()));
    }
  }
}

json Bench::Result() const {
  json contenders = json::object();
  for (const auto& [name, s] : series_) contenders[name] = s.Summary();
  const auto& S = series_;
  json result = {
      {"benchmark", "weightload"},
      {"model", flags_.model},
      {"files", files_.size()},
      {"bytes", total_},
      {"rounds", flags_.rounds},
      {"fio_gbps", MedianOrNull(S.at("fio"))},
      {"dd_direct_gbps", MedianOrNull(S.at("dd"))},
      {"baton_gbps", MedianOrNull(S.at("baton"))},
      {"baton_e2e_gbps", MedianOrNull(S.at("baton_e2e"))},
      {"read_gbps", MedianOrNull(S.at("read"))},
      {"mmap_gbps", MedianOrNull(S.at("mmap"))},
      {"baton_vs_fio", Ratio(S.at("baton"), S.at("fio"))},
      {"baton_vs_mmap", Ratio(S.at("baton"), S.at("mmap"))},
      {"baton_vs_fio_paired", PairedRatio(rounds_, "baton", "fio")},
      {"baton_vs_mmap_paired", PairedRatio(rounds_, "baton", "mmap")},
      {"evicted", evicted_},
      {"max_resident_fraction", worst_resident_},
      {"baton_method", last_baton_.stats.method},
      {"baton_fallback_reason", last_baton_.stats.fallback_reason},
      {"arena_huge_pages", last_baton_.huge_pages},
      {"arena_locked", last_baton_.locked},
      {"arena_warnings", last_baton_.warnings},
      {"baton_verified", verified_ ? json(verified_->empty()) : json(nullptr)},
      {"fio_command", Join(fio_fixed_buffers_ ? fio_command_ : fio_plain_command_)},
      {"fio_registered_buffers", fio_ran_ ? json(fio_fixed_buffers_) : json(nullptr)},
      {"fio_fixedbufs_error",
       fio_fixedbufs_error_.empty() ? json(nullptr) : json(fio_fixedbufs_error_)},
      {"fio_error", fio_error_.empty() ? json(nullptr) : json(fio_error_)},
      {"load_average", {load_at_start_, LoadAverage()}},
      {"contenders", contenders},
  };
  const json& vs_fio = result["baton_vs_fio"];
  const json& vs_mmap = result["baton_vs_mmap"];
  result["meets_targets"] = vs_fio.is_number() && vs_mmap.is_number() &&
                            vs_fio.get<double>() >= kTargetVsFio &&
                            vs_mmap.get<double>() >= kTargetVsMmap;
  if (wrong_data()) result["baton_verify_error"] = *verified_;
  return result;
}

int Run(const Flags& flags) {
  Bench bench(flags);
  if (Status s = bench.Setup(); !s.ok()) return perf::FailRun(kName, s);
  for (int round = 1; round <= flags.rounds; ++round) bench.RunRound(round);
  bench.PrintTable();
  json result = bench.Result();
  if (result.contains("baton_verify_error")) {
    std::fprintf(stderr, "weightload: Baton loaded wrong data: %s\n",
                 result["baton_verify_error"].get<std::string>().c_str());
  }
  if (bench.failed()) {  // the measurements stay, with the error beside them
    result["ok"] = false;
    result["error"] =
        result.contains("baton_verify_error")
            ? "Baton loaded wrong data: " + result["baton_verify_error"].get<std::string>()
            : std::string("no Baton round succeeded");
  }
  if (Status s = perf::EmitResult(result, flags.out, "weightload.json"); !s.ok()) {
    return perf::FailRun(kName, s);
  }
  return bench.failed() ? 1 : 0;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) {
  return baton::perf::RunPerfDriver<baton::Flags>(argc, argv, baton::kName, baton::kUsage,
                                                  baton::ParseFlags, baton::Run);
}
