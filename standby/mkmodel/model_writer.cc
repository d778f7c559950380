#include "standby/mkmodel/model_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string_view>
#include <thread>

#include "base/clock.h"
#include "base/io/unique_fd.h"
#include "base/log.h"

namespace baton {
namespace {

constexpr uint64_t kBlockSize = 32u << 20;
constexpr uint64_t kDirectAlignment = 4096;
constexpr uint64_t kMaxSmallFile = 256u << 20;
constexpr char kTempMarker[] = ".baton-tmp-";

std::string JoinPath(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

std::string TempName(const std::string& dir, const std::string& name) {
  return JoinPath(dir, "." + name + kTempMarker + std::to_string(::getpid()));
}

// Writes all of `data`; returns 0 or the errno of the failing write, with the bytes
// written before it in `*written`.
int WriteFully(int fd, const uint8_t* data, uint64_t size, uint64_t* written) {
  *written = 0;
  while (*written < size) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(size - *written, 1u << 30));
    const ssize_t n = ::write(fd, data + *written, want);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return EIO;
    *written += static_cast<uint64_t>(n);
  }
  return 0;
}

Status WriteAll(int fd, const uint8_t* data, uint64_t size, const std::string& path) {
  uint64_t written = 0;
  const int err = WriteFully(fd, data, size, &written);
  return err == 0 ? OkStatus() : ErrnoStatus("write " + path, err);
}

Result<UniqueFd> CreateSmallTemp(const std::string& path) {
  ::unlink(path.c_str());
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!fd) return ErrnoStatus("create " + path, errno);
  return fd;
}

Status Finish(UniqueFd fd, const std::string& temp, const std::string& final_path, bool sync) {
  if (sync && ::fsync(fd.get()) != 0) return ErrnoStatus("fsync " + temp, errno);
  if (::close(fd.Release()) != 0) return ErrnoStatus("close " + temp, errno);
  if (::rename(temp.c_str(), final_path.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    return ErrnoStatus("rename " + temp + " to " + final_path, err);
  }
  return OkStatus();
}

Status WriteSmallFile(const std::string& dir, const std::string& name, const std::string& text,
                      bool sync) {
  const std::string temp = TempName(dir, name);
  BATON_ASSIGN_OR_RETURN(UniqueFd fd, CreateSmallTemp(temp));
  Status written =
      WriteAll(fd.get(), reinterpret_cast<const uint8_t*>(text.data()), text.size(), temp);
  if (!written.ok()) {
    ::unlink(temp.c_str());
    return written;
  }
  return Finish(std::move(fd), temp, JoinPath(dir, name), sync);
}

Result<std::string> ReadSmallFile(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return ErrnoStatus("open " + path, errno);
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus("read " + path, errno);
    if (n == 0) return out;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > kMaxSmallFile) return FailedPrecondition(path + ": larger than expected");
  }
}

struct FreeDeleter {
  void operator()(uint8_t* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<uint8_t, FreeDeleter>;

// Opens a new temporary file for O_DIRECT writes when the file system allows it: buffered
// writes of multi-GB files are throttled by dirty-page writeback on many machines, direct
// ones run at the disk's speed and leave nothing in the page cache.
Result<UniqueFd> CreateTemp(const std::string& path, bool* direct) {
  ::unlink(path.c_str());
  const int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC;
  UniqueFd fd(::open(path.c_str(), flags | O_DIRECT, 0644));
  *direct = fd.valid();
  if (!fd && errno == EINVAL) fd = UniqueFd(::open(path.c_str(), flags, 0644));
  if (!fd) return ErrnoStatus("create " + path, errno);
  return fd;
}

// Writes `size` bytes; with O_DIRECT, `size` is rounded up to the alignment (the buffer
// must hold the padding) and the file is cut back to length afterwards. Falls back to
// buffered writes when the file system refuses a direct one.
Status WriteBlock(int fd, const uint8_t* data, uint64_t size, bool* direct,
                  const std::string& path) {
  uint64_t written = 0;
  if (*direct) {
    const uint64_t padded = (size + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment;
    const int err = WriteFully(fd, data, padded, &written);
    if (err == 0) return OkStatus();
    if (err != EINVAL || written > size) return ErrnoStatus("write " + path, err);
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_DIRECT) != 0) {
      return ErrnoStatus("write " + path + " (leaving O_DIRECT)", errno);
    }
    *direct = false;
  }
  return WriteAll(fd, data + written, size - written, path);
}

// Fills bytes [begin, end) of a shard's data section into `out` using `threads` threads.
void FillParallel(const ModelLayout& layout, size_t shard, uint64_t begin, uint64_t end,
                  uint8_t* out, int threads) {
  const uint64_t esize = ModelDTypeSize(layout.spec.dtype);
  const uint64_t parts = static_cast<uint64_t>(std::max(1, threads));
  const uint64_t step = std::max(esize, ((end - begin) / esize + parts - 1) / parts * esize);
  std::vector<std::thread> workers;
  for (uint64_t a = begin + step; a < end; a += step) {
    const uint64_t b = std::min(end, a + step);
    workers.emplace_back([&layout, shard, a, b, dst = out + (a - begin)] {
      FillShardData(layout, shard, a, b, dst);
    });
  }
  FillShardData(layout, shard, begin, std::min(end, begin + step), out);
  for (std::thread& w : workers) w.join();
}

// Fills bytes [begin, end) of a shard's file (header, then data) into `out`.
void FillFileRange(const ModelLayout& layout, size_t shard, uint64_t begin, uint64_t end,
                   uint8_t* out, int threads) {
  const std::string& header = layout.shards[shard].header;
  if (begin < header.size()) {
    const uint64_t stop = std::min<uint64_t>(end, header.size());
    std::memcpy(out, header.data() + begin, stop - begin);
    out += stop - begin;
    begin = stop;
  }
  if (begin < end)
    FillParallel(layout, shard, begin - header.size(), end - header.size(), out, threads);
}

// Generates block k+1 while a writer thread writes block k.
Status WriteShardFile(int fd, const std::string& path, const ModelLayout& layout, size_t shard,
                      int threads, bool* direct) {
  const uint64_t size = layout.shards[shard].file_size();
  const uint64_t block =
      std::min(kBlockSize, (size + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment);
  AlignedBuffer buffers[2];
  for (AlignedBuffer& b : buffers) {
    b.reset(static_cast<uint8_t*>(std::aligned_alloc(kDirectAlignment, block)));
    if (!b) return ResourceExhausted("cannot allocate a " + std::to_string(block) + "-byte buffer");
  }
  std::thread writer;
  Status write_status;
  uint64_t k = 0;
  for (uint64_t offset = 0; offset < size; offset += block, ++k) {
    const uint64_t length = std::min(block, size - offset);
    uint8_t* buffer = buffers[k & 1].get();
    FillFileRange(layout, shard, offset, offset + length, buffer, threads);
    std::memset(buffer + length, 0, block - length);
    if (writer.joinable()) writer.join();
    if (!write_status.ok()) return write_status;
    writer = std::thread([&write_status, fd, buffer, length, direct, &path] {
      write_status = WriteBlock(fd, buffer, length, direct, path);
    });
  }
  if (writer.joinable()) writer.join();
  BATON_RETURN_IF_ERROR(write_status);
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) return ErrnoStatus("truncate " + path, errno);
  return OkStatus();
}

Status WriteShard(const ModelLayout& layout, size_t shard, const std::string& dir,
                  const WriteOptions& options) {
  const PlannedShard& s = layout.shards[shard];
  const std::string temp = TempName(dir, s.file_name);
  bool direct = false;
  BATON_ASSIGN_OR_RETURN(UniqueFd fd, CreateTemp(temp, &direct));
  Status status = WriteShardFile(fd.get(), temp, layout, shard, options.threads, &direct);
  if (!status.ok()) {
    ::unlink(temp.c_str());
    return status;
  }
  return Finish(std::move(fd), temp, JoinPath(dir, s.file_name), options.sync);
}

// Consumes `prefix` from the front of `text`.
bool Consume(std::string_view& text, std::string_view prefix) {
  if (text.substr(0, prefix.size()) != prefix) return false;
  text.remove_prefix(prefix.size());
  return true;
}

bool ConsumeDigits(std::string_view& text) {
  size_t n = 0;
  while (n < text.size() && text[n] >= '0' && text[n] <= '9') ++n;
  text.remove_prefix(n);
  return n > 0;
}

// "model-<digits>-of-<digits>.safetensors"
bool IsShardFileName(std::string_view name) {
  return Consume(name, "model-") && ConsumeDigits(name) && Consume(name, "-of-") &&
         ConsumeDigits(name) && name == ".safetensors";
}

bool IsModelFileName(const std::string& name) {
  return name == kConfigFileName || name == kSingleFileName || name == kIndexFileName ||
         IsShardFileName(name) || name.find(kTempMarker) != std::string::npos;
}

Status RemoveModelFiles(const std::string& dir) {
  std::error_code ec;
  std::vector<std::filesystem::path> doomed;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (IsModelFileName(entry.path().filename().string())) doomed.push_back(entry.path());
  }
  if (ec) return Status(StatusCode::kIoError, "list " + dir + ": " + ec.message());
  // config.json goes first: a directory without it is not a complete model.
  std::sort(doomed.begin(), doomed.end(), [](const auto& a, const auto& b) {
    return (a.filename() == kConfigFileName) > (b.filename() == kConfigFileName);
  });
  for (const auto& path : doomed) {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return ErrnoStatus("remove " + path.string(), errno);
    }
  }
  return OkStatus();
}

// A model this writer did not write (a downloaded one, say) is never removed to make room:
// its config.json names no baton-mkmodel as its generator.
Status CheckNoForeignModel(const std::string& dir) {
  const std::string path = dir + "/" + kConfigFileName;
  if (::access(path.c_str(), F_OK) != 0) return OkStatus();
  Result<std::string> config = ReadSmallFile(path);
  const bool ours =
      config.ok() && config->find("\"generator\": \"baton-mkmodel\"") != std::string::npos;
  if (ours) return OkStatus();
  return FailedPrecondition(dir + " holds a model baton-mkmodel did not write (its config.json " +
                            "names no \"generator\": \"baton-mkmodel\"): it is left as it is; " +
                            "give an empty directory, or one baton-mkmodel wrote");
}

Status CheckFreeSpace(const std::string& dir, uint64_t needed) {
  struct statvfs fs;
  if (::statvfs(dir.c_str(), &fs) != 0) return ErrnoStatus("statvfs " + dir, errno);
  const uint64_t available = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  if (available >= needed + (64u << 20)) return OkStatus();
  return ResourceExhausted(dir + ": the model needs " + std::to_string(needed) +
                           " bytes but the file system has " + std::to_string(available) +
                           " available");
}

Status SyncDirectory(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd) return ErrnoStatus("open " + dir, errno);
  if (::fsync(fd.get()) != 0) return ErrnoStatus("fsync " + dir, errno);
  return OkStatus();
}

Status CheckShard(const PlannedShard& shard, const std::string& dir) {
  const std::string path = JoinPath(dir, shard.file_name);
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return FailedPrecondition(path + " is missing");
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus("stat " + path, errno);
  if (static_cast<uint64_t>(st.st_size) != shard.file_size()) {
    return FailedPrecondition(path + " has " + std::to_string(st.st_size) + " bytes, expected " +
                              std::to_string(shard.file_size()));
  }
  std::string header(shard.header.size(), '\0');
  const ssize_t n = ::pread(fd.get(), header.data(), header.size(), 0);
  if (n != static_cast<ssize_t>(header.size()) || header != shard.header) {
    return FailedPrecondition(path + ": safetensors header differs from the spec's");
  }
  return OkStatus();
}

ModelSummary Summarize(const ModelLayout& layout, const std::string& dir) {
  ModelSummary summary;
  summary.dir = dir;
  for (const PlannedShard& s : layout.shards) summary.files.push_back(s.file_name);
  if (!layout.index_json.empty()) summary.files.push_back(kIndexFileName);
  summary.files.push_back(kConfigFileName);
  summary.tensor_count = layout.tensors.size();
  summary.tensor_bytes = layout.tensor_bytes;
  summary.file_bytes = layout.file_bytes;
  return summary;
}

}  // namespace

Status CheckWrittenModel(const ModelLayout& layout, const std::string& dir) {
  const std::string config_path = JoinPath(dir, kConfigFileName);
  Result<std::string> config = ReadSmallFile(config_path);
  if (!config.ok()) return FailedPrecondition(config_path + " is missing or unreadable");
  if (*config != ConfigJson(layout.spec)) {
    return FailedPrecondition(config_path + " describes a different model");
  }
  const std::string index_path = JoinPath(dir, kIndexFileName);
  if (layout.index_json.empty()) {
    if (::access(index_path.c_str(), F_OK) == 0) {
      return FailedPrecondition(index_path + " exists but the spec has one file");
    }
  } else {
    Result<std::string> index = ReadSmallFile(index_path);
    if (!index.ok() || *index != layout.index_json) {
      return FailedPrecondition(index_path + " is missing or differs from the spec's");
    }
  }
  for (const PlannedShard& shard : layout.shards) BATON_RETURN_IF_ERROR(CheckShard(shard, dir));
  return OkStatus();
}

Result<ModelSummary> WriteModel(const ModelSpec& spec, const std::string& dir) {
  return WriteModel(spec, dir, WriteOptions{});
}

Result<ModelSummary> WriteModel(const ModelSpec& spec, const std::string& dir,
                                const WriteOptions& options) {
  const TimePoint start = RealClock::Get().Now();
  if (dir.empty()) return InvalidArgument("model directory is empty");
  BATON_ASSIGN_OR_RETURN(ModelLayout layout, PlanModel(spec));
  ModelSummary summary = Summarize(layout, dir);
  if (options.reuse) {
    const Status current = CheckWrittenModel(layout, dir);
    if (current.ok()) {
      summary.reused = true;
      return summary;
    }
    BATON_LOG(INFO, "mkmodel") << "writing " << dir << ": " << current.message();
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status(StatusCode::kIoError, "create directory " + dir + ": " + ec.message());
  BATON_RETURN_IF_ERROR(CheckNoForeignModel(dir));
  BATON_RETURN_IF_ERROR(RemoveModelFiles(dir));
  BATON_RETURN_IF_ERROR(CheckFreeSpace(dir, layout.file_bytes));
  for (size_t k = 0; k < layout.shards.size(); ++k) {
    BATON_RETURN_IF_ERROR(WriteShard(layout, k, dir, options));
  }
  if (!layout.index_json.empty()) {
    BATON_RETURN_IF_ERROR(WriteSmallFile(dir, kIndexFileName, layout.index_json, options.sync));
  }
  BATON_RETURN_IF_ERROR(WriteSmallFile(dir, kConfigFileName, ConfigJson(spec), options.sync));
  if (options.sync) BATON_RETURN_IF_ERROR(SyncDirectory(dir));
  summary.seconds = MillisBetween(start, RealClock::Get().Now()) / 1000.0;
  return summary;
}

}  // namespace baton
