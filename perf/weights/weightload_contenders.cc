#include "perf/weights/weightload_contenders.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
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
#include "standby/mkmodel/model_layout.h"
#include "weightcache/model_files.h"
#include "weightcache/weight_cache.h"

extern char** environ;

namespace baton::perf {

using nlohmann::json;

double SecondsSince(TimePoint start) { return MillisBetween(start, RealClock::Get().Now()) / 1e3; }

// ---- page cache --------------------------------------------------------------------------

// Drops every file's pages from the page cache and returns the fraction still resident.
Result<double> ResidentFraction(const std::vector<std::string>& files) {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  uint64_t pages = 0, resident = 0;
  for (const std::string& path : files) {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) return ErrnoStatus("open " + path, errno);
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) return ErrnoStatus("stat " + path, errno);
    const size_t size = static_cast<size_t>(st.st_size);
    if (size == 0) continue;
    void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.get(), 0);
    if (map == MAP_FAILED) return ErrnoStatus("mmap " + path, errno);
    std::vector<unsigned char> vec((size + page - 1) / page);
    const int rc = ::mincore(map, size, vec.data());
    const int err = errno;
    ::munmap(map, size);
    if (rc != 0) return ErrnoStatus("mincore " + path, err);
    pages += vec.size();
    for (unsigned char v : vec) resident += v & 1;
  }
  return pages ? static_cast<double>(resident) / static_cast<double>(pages) : 0.0;
}

Result<double> Evict(const std::vector<std::string>& files) {
  for (const std::string& path : files) {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) return ErrnoStatus("open " + path, errno);
    // Dirty pages cannot be dropped; write them first.
    if (::fdatasync(fd.get()) != 0) return ErrnoStatus("fdatasync " + path, errno);
    if (int err = ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED); err != 0) {
      return ErrnoStatus("posix_fadvise " + path, err);
    }
  }
  return ResidentFraction(files);
}

// ---- child processes ---------------------------------------------------------------------

static Result<std::string> ReadMemfd(int fd) {
  std::string text;
  char buf[1 << 16];
  if (::lseek(fd, 0, SEEK_SET) < 0) return ErrnoStatus("lseek", errno);
  for (ssize_t n; (n = ::read(fd, buf, sizeof(buf))) > 0;) text.append(buf, n);
  return text;
}

// Runs argv (looked up in PATH) with stdout and stderr captured; stdin is /dev/null.
Result<CommandResult> RunCommand(const std::vector<std::string>& argv) {
  UniqueFd out(::memfd_create("child-stdout", MFD_CLOEXEC));
  UniqueFd err(::memfd_create("child-stderr", MFD_CLOEXEC));
  if (!out || !err) return ErrnoStatus("memfd_create", errno);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out.get(), 1);
  posix_spawn_file_actions_adddup2(&actions, err.get(), 2);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  CommandResult result;
  const TimePoint start = RealClock::Get().Now();
  pid_t pid = 0;
  const int rc = ::posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc == ENOENT) {
    return Unavailable(argv[0] + " is not installed (scripts/install-deps installs it)");
  }
  if (rc != 0) return ErrnoStatus("start " + argv[0], rc);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return ErrnoStatus("waitpid " + argv[0], errno);
  }
  result.seconds = SecondsSince(start);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  BATON_ASSIGN_OR_RETURN(result.out, ReadMemfd(out.get()));
  BATON_ASSIGN_OR_RETURN(result.err, ReadMemfd(err.get()));
  if (result.exit_code != 0) {
    return Internal(argv[0] + " exited with " + std::to_string(result.exit_code) + ": " +
                    result.err.substr(0, 500));
  }
  return result;
}

// ---- contenders --------------------------------------------------------------------------

std::vector<std::string> FioCommand(const std::string& fio, const std::vector<std::string>& files,
                                    bool fixed_buffers) {
  std::string names;
  for (const std::string& f : files) {
    if (!names.empty()) names += ':';
    for (char c : f) names += c == ':' ? std::string("\\:") : std::string(1, c);
  }
  std::vector<std::string> command = {
      fio,         "--name=weightload", "--readonly",   "--ioengine=io_uring", "--direct=1",
      "--rw=read", "--bs=1M",           "--iodepth=32", "--numjobs=1"};
  if (fixed_buffers) command.push_back("--fixedbufs");
  command.push_back("--filename=" + names);
  command.push_back("--output-format=json");
  return command;
}

Result<Sample> RunFio(const std::vector<std::string>& command) {
  BATON_ASSIGN_OR_RETURN(CommandResult run, RunCommand(command));
  const size_t brace = run.out.find('{');
  const json report = json::parse(brace == std::string::npos ? "" : run.out.substr(brace), nullptr,
                                  /*allow_exceptions=*/false);
  try {
    const json& job = report.at("jobs").at(0);
    if (job.at("error").get<int>() != 0) return Internal("fio job error: " + job.dump());
    Sample s;
    s.bytes = job.at("read").at("io_bytes").get<uint64_t>();
    s.seconds = job.at("read").at("runtime").get<double>() / 1e3;  // milliseconds
    return s;
  } catch (const json::exception& e) {
    return Internal(std::string("unreadable fio JSON output: ") + e.what());
  }
}

Result<Sample> RunDd(const std::vector<std::string>& files, const std::vector<uint64_t>& sizes) {
  Sample s;
  const TimePoint start = RealClock::Get().Now();
  for (size_t i = 0; i < files.size(); ++i) {
    BATON_RETURN_IF_ERROR(
        RunCommand({"dd", "if=" + files[i], "of=/dev/null", "iflag=direct", "bs=4M", "status=none"})
            .status());
    s.bytes += sizes[i];
  }
  s.seconds = SecondsSince(start);
  return s;
}

// Checks sampled ranges of every tensor against the generator's values (for models written
// by baton-mkmodel); returns nullopt when the directory is not such a model.
std::optional<std::string> VerifyAgainstGenerator(const WeightCache& cache,
                                                  const std::string& dir) {
  std::ifstream in(dir + "/config.json", std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::optional<ModelSpec> spec = SpecFromConfigJson(text);
  if (!spec) return std::nullopt;
  Result<ModelLayout> layout = PlanModel(*spec);
  if (!layout.ok()) return std::nullopt;
  std::vector<uint8_t> want;
  for (const PlannedTensor& t : layout->tensors) {
    const CachedTensor* c = cache.Find(t.name);
    if (!c || c->size != t.end - t.begin) return "tensor " + t.name + " missing or resized";
    const uint64_t n = std::min<uint64_t>(c->size, 1u << 16);
    for (uint64_t at : {uint64_t{0}, (c->size - n) / 2 & ~uint64_t{7}, c->size - n}) {
      want.resize(n);
      FillShardData(*layout, t.shard, t.begin + at, t.begin + at + n, want.data());
      if (std::memcmp(cache.TensorData(*c) + at, want.data(), n) != 0) {
        return "tensor " + t.name + " differs from the generated values at byte " +
               std::to_string(at);
      }
    }
  }
  return std::string();
}

Result<BatonSample> RunBaton(const std::string& dir, std::optional<std::string>* verified) {
  const TimePoint start = RealClock::Get().Now();
  BATON_ASSIGN_OR_RETURN(WeightCache cache, WeightCache::Load(dir, WeightCacheOptions{}));
  BatonSample s;
  s.end_to_end.seconds = SecondsSince(start);
  s.stats = cache.load_stats();
  s.fill.bytes = s.end_to_end.bytes = s.stats.bytes;
  s.fill.seconds = s.stats.seconds;
  s.warnings = cache.arena().warnings();
  s.huge_pages = cache.arena().huge_pages();
  s.locked = cache.arena().locked();
  if (verified && !verified->has_value()) {
    std::optional<std::string> problem = VerifyAgainstGenerator(cache, dir);
    *verified = problem ? *problem : "";
  }
  return s;
}

Result<Sample> RunRead(const std::vector<std::string>& files, uint8_t* dest, uint64_t capacity) {
  Sample s;
  const TimePoint start = RealClock::Get().Now();
  for (const std::string& path : files) {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) return ErrnoStatus("open " + path, errno);
    for (ssize_t n; (n = ::read(fd.get(), dest + s.bytes,
                                std::min<uint64_t>(1u << 30, capacity - s.bytes)));) {
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoStatus("read " + path, errno);
      s.bytes += static_cast<uint64_t>(n);
    }
  }
  s.seconds = SecondsSince(start);
  return s;
}

Result<Sample> RunMmap(const ModelFiles& model, uint8_t* dest) {
  Sample s;
  const TimePoint start = RealClock::Get().Now();
  for (const SafetensorsIndex& shard : model.shards()) {
    UniqueFd fd(::open(shard.path().c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) return ErrnoStatus("open " + shard.path(), errno);
    const size_t size = shard.file_size();
    void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.get(), 0);
    if (map == MAP_FAILED) return ErrnoStatus("mmap " + shard.path(), errno);
    const uint8_t* data = static_cast<const uint8_t*>(map) + shard.data_offset();
    for (const TensorInfo& t : shard.tensors()) {
      std::memcpy(dest, data + t.begin, t.size());
      dest += t.size();
      s.bytes += t.size();
    }
    ::munmap(map, size);
  }
  s.seconds = SecondsSince(start);
  return s;
}

}  // namespace baton::perf
