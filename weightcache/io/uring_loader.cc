#include "weightcache/io/uring_loader.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>

#include "base/align.h"
#include "base/io/unique_fd.h"
#include "base/log.h"

namespace baton {
namespace {

constexpr char kComponent[] = "loader";
constexpr uint64_t kAlign = kDirectIoAlignment;

uint64_t AlignUp(uint64_t v) { return RoundUp(v, kAlign); }
uint64_t AlignDown(uint64_t v) { return v / kAlign * kAlign; }
bool Aligned(uint64_t v) { return v % kAlign == 0; }

struct OpenFile {
  std::string path;
  UniqueFd fd;
  UniqueFd buffered;  // for unaligned remainders of a direct file; opened on first need
  bool direct = false;
  uint64_t size = 0;
};

// One request: `length` bytes of file `file` at `offset` into `dest`. `valid` is the part
// of it the job wants (less than length only for a last block rounded up past EOF).
struct Chunk {
  size_t file = 0;
  uint64_t offset = 0;
  uint8_t* dest = nullptr;
  uint64_t length = 0;
  uint64_t valid = 0;
  bool direct = false;  // issued on an O_DIRECT descriptor
};

// The part of a job still to be cut into chunks.
struct Cursor {
  size_t file = 0;
  uint64_t offset = 0;
  uint8_t* dest = nullptr;
  uint64_t remaining = 0;  // bytes to request, possibly rounded up past EOF
  uint64_t valid_end = 0;  // file offset where the job's wanted bytes end
};

Status PreadAll(int fd, uint8_t* dest, uint64_t length, uint64_t offset, const std::string& path,
                uint64_t* done) {
  *done = 0;
  while (*done < length) {
    ssize_t n = ::pread(fd, dest + *done, length - *done, static_cast<off_t>(offset + *done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return ErrnoStatus("read of " + path + " at offset " + std::to_string(offset + *done), errno);
    }
    if (n == 0) break;  // end of file
    *done += static_cast<uint64_t>(n);
  }
  return OkStatus();
}

// The state of one Load(): open files, the work left, and the bytes done.
class LoadRun {
 public:
  LoadRun(const LoadOptions& options, uint8_t* region, uint64_t region_size)
      : options_(options), region_(region), region_size_(region_size) {}

  Status Plan(const std::vector<ReadJob>& jobs);
  Status RunUring();
  Status RunPread();
  Status ReadTails();
  void Finish();

  uint64_t bytes() const { return bytes_; }
  bool used_uring() const { return used_uring_; }
  bool all_direct() const {
    return options_.direct &&
           std::all_of(files_.begin(), files_.end(), [](const OpenFile& f) { return f.direct; });
  }
  const std::string& fallback_reason() const { return fallback_; }
  void AddFallback(const std::string& why) {
    BATON_LOG(WARN, kComponent) << why;
    fallback_ += (fallback_.empty() ? "" : "; ") + why;
  }

 private:
  Result<size_t> OpenOnce(const std::string& path);
  Status AddJob(const ReadJob& job);
  bool Next(Chunk* out);
  Status Complete(const Chunk& c, int64_t res);
  Status FinishBuffered(const Chunk& c);
  Status SwitchToBuffered(size_t file, int err);
  void Report() {
    if (options_.progress) options_.progress(bytes_, total_);
  }

  const LoadOptions& options_;
  uint8_t* region_;
  uint64_t region_size_;
  std::vector<OpenFile> files_;
  std::map<std::string, size_t> by_path_;
  std::deque<Cursor> pending_;  // jobs not started
  std::vector<Cursor> active_;  // at most files_in_flight
  std::deque<Chunk> retries_;   // rests of short reads
  std::vector<Chunk> tails_;    // partial last blocks of direct jobs, read buffered
  size_t turn_ = 0;
  bool used_uring_ = false;
  uint64_t bytes_ = 0;
  uint64_t total_ = 0;
  // Ranges to zero after the reads: bytes past EOF that the job asked for or that a rounded
  // up direct read may have filled.
  std::vector<std::pair<uint8_t*, uint64_t>> zero_;
  std::string fallback_;
};

Result<size_t> LoadRun::OpenOnce(const std::string& path) {
  auto it = by_path_.find(path);
  if (it != by_path_.end()) return it->second;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    Status s = ErrnoStatus("stat " + path, err);
    return err == ENOENT ? NotFound(s.message()) : s;
  }
  if (!S_ISREG(st.st_mode)) return InvalidArgument(path + " is not a regular file");
  OpenFile f;
  f.path = path;
  f.direct = options_.direct;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (f.direct ? O_DIRECT : 0));
  if (fd < 0 && f.direct && errno == EINVAL) {
    AddFallback("O_DIRECT refused by the file system for " + path + " (EINVAL): buffered reads");
    f.direct = false;
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  }
  if (fd < 0) {
    const int err = errno;
    Status s = ErrnoStatus("open " + path, err);
    return err == ENOENT ? NotFound(s.message()) : s;
  }
  f.fd = UniqueFd(fd);
  if (::fstat(fd, &st) != 0) return ErrnoStatus("fstat " + path, errno);
  f.size = static_cast<uint64_t>(st.st_size);
  if (!f.direct) ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  files_.push_back(std::move(f));
  by_path_[path] = files_.size() - 1;
  return files_.size() - 1;
}

Status LoadRun::AddJob(const ReadJob& job) {
  const std::string where =
      "read job for " + job.path + " at offset " + std::to_string(job.file_offset);
  const uint64_t region_end = reinterpret_cast<uint64_t>(region_) + region_size_;
  const uint64_t dest = reinterpret_cast<uint64_t>(job.dest);
  if (!Aligned(job.file_offset) || !Aligned(dest)) {
    return InvalidArgument(where + ": file offset and destination must be multiples of 4096");
  }
  if (dest < reinterpret_cast<uint64_t>(region_) || job.length > region_end - dest ||
      dest > region_end) {
    return InvalidArgument(where + ": destination is outside the region");
  }
  BATON_ASSIGN_OR_RETURN(size_t file, OpenOnce(job.path));
  const OpenFile& f = files_[file];
  const uint64_t have = f.size > job.file_offset ? f.size - job.file_offset : 0;
  const uint64_t valid = std::min(job.length, have);
  uint64_t request = valid;
  uint64_t zero_end = job.length;
  if (f.direct && !Aligned(valid)) {
    if (job.file_offset + valid == f.size && dest + AlignUp(valid) <= region_end) {
      request = AlignUp(valid);  // the last block of the file, read whole; EOF shortens it
      zero_end = std::max(zero_end, request);
    } else {
      request = AlignDown(valid);  // the partial last block goes through the page cache
      const uint64_t tail = valid - request;
      tails_.push_back(Chunk{file, job.file_offset + request, job.dest + request, tail, tail});
    }
  }
  if (zero_end > valid) zero_.emplace_back(job.dest + valid, zero_end - valid);
  total_ += valid;
  if (request > 0) {
    pending_.push_back(Cursor{file, job.file_offset, job.dest, request,
                              job.file_offset + std::min(valid, request)});
  }
  return OkStatus();
}

Status LoadRun::Plan(const std::vector<ReadJob>& jobs) {
  if (options_.chunk_size < kAlign || !Aligned(options_.chunk_size) ||
      options_.chunk_size > (1ull << 30)) {
    return InvalidArgument("chunk size " + std::to_string(options_.chunk_size) +
                           " must be a multiple of 4096 between 4 KiB and 1 GiB");
  }
  if (options_.max_registered_buffer < kAlign || !Aligned(options_.max_registered_buffer)) {
    return InvalidArgument("registered buffer size must be a positive multiple of 4096");
  }
  if (options_.queue_depth == 0 || options_.queue_depth > 4096) {
    return InvalidArgument("queue depth " + std::to_string(options_.queue_depth) +
                           " must be between 1 and 4096");
  }
  if (!Aligned(reinterpret_cast<uint64_t>(region_))) {
    return InvalidArgument("the load region must start on a 4096-byte boundary");
  }
  for (const ReadJob& job : jobs) BATON_RETURN_IF_ERROR(AddJob(job));
  return OkStatus();
}

// Cuts the next request, alternating between up to files_in_flight jobs. A request never
// crosses a registered buffer boundary (those are multiples of max_registered_buffer from
// the region's start).
bool LoadRun::Next(Chunk* out) {
  if (!retries_.empty()) {
    *out = retries_.front();
    retries_.pop_front();
    return true;
  }
  const size_t lanes = std::max<size_t>(1, options_.files_in_flight);
  while (active_.size() < lanes && !pending_.empty()) {
    active_.push_back(pending_.front());
    pending_.pop_front();
  }
  if (active_.empty()) return false;
  turn_ %= active_.size();
  Cursor& c = active_[turn_];
  const uint64_t piece = options_.max_registered_buffer;
  const uint64_t rel = static_cast<uint64_t>(c.dest - region_);
  const uint64_t to_boundary = piece - rel % piece;
  const uint64_t len = std::min({options_.chunk_size, c.remaining, to_boundary});
  const uint64_t valid = c.offset >= c.valid_end ? 0 : std::min(len, c.valid_end - c.offset);
  *out = Chunk{c.file, c.offset, c.dest, len, valid, files_[c.file].direct};
  c.offset += len;
  c.dest += len;
  c.remaining -= len;
  if (c.remaining == 0) {
    active_.erase(active_.begin() + static_cast<ptrdiff_t>(turn_));
  } else {
    ++turn_;
  }
  return true;
}

Status LoadRun::SwitchToBuffered(size_t file, int err) {
  OpenFile& f = files_[file];
  int fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("open " + f.path, errno);
  AddFallback("O_DIRECT read of " + f.path + " failed (" + std::strerror(err) +
              "): buffered reads");
  f.fd = UniqueFd(fd);
  f.direct = false;
  return OkStatus();
}

// Reads the rest of a chunk with a buffered pread (for a direct read that came back short
// at an offset the device cannot continue from).
Status LoadRun::FinishBuffered(const Chunk& c) {
  OpenFile& f = files_[c.file];
  if (f.direct && !f.buffered.valid()) {
    int fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus("open " + f.path, errno);
    f.buffered = UniqueFd(fd);
  }
  const int fd = f.direct ? f.buffered.get() : f.fd.get();
  uint64_t done = 0;
  BATON_RETURN_IF_ERROR(PreadAll(fd, c.dest, c.valid, c.offset, f.path, &done));
  if (done < c.valid) {
    return DataLoss(f.path + " ended at " + std::to_string(c.offset + done) +
                    " while reading; it was " + std::to_string(f.size) + " bytes at open");
  }
  bytes_ += done;
  return OkStatus();
}

// Accounts one finished request: `res` is the byte count or -errno.
Status LoadRun::Complete(const Chunk& c, int64_t res) {
  OpenFile& f = files_[c.file];
  if (res == -EINTR || res == -EAGAIN) {
    retries_.push_back(c);
    return OkStatus();
  }
  if (res == -EINVAL && c.direct) {
    // Some file systems accept O_DIRECT at open and refuse it at read time.
    if (f.direct) BATON_RETURN_IF_ERROR(SwitchToBuffered(c.file, EINVAL));
    Chunk again = c;
    again.direct = false;
    retries_.push_back(again);
    return OkStatus();
  }
  if (res < 0) {
    return ErrnoStatus("read of " + std::to_string(c.length) + " bytes of " + f.path +
                           " at offset " + std::to_string(c.offset),
                       static_cast<int>(-res));
  }
  const uint64_t got = static_cast<uint64_t>(res);
  bytes_ += std::min(got, c.valid);
  if (got >= c.valid) return OkStatus();
  if (got == 0) {
    return DataLoss(f.path + " ended at " + std::to_string(c.offset) + " while reading; it was " +
                    std::to_string(f.size) + " bytes at open");
  }
  Chunk rest{c.file, c.offset + got, c.dest + got, c.length - got, c.valid - got, c.direct};
  if (c.direct && !Aligned(got)) return FinishBuffered(rest);
  retries_.push_back(rest);
  return OkStatus();
}

// Owns an io_uring instance and its buffer registration. The registration is dropped
// explicitly first: ring teardown is asynchronous in the kernel, and pages it still pins
// (huge pages in particular) would otherwise stay allocated for a while after Load().
struct Ring {
  io_uring ring{};
  bool ok = false;
  bool registered = false;
  ~Ring() {
    if (registered) io_uring_unregister_buffers(&ring);
    if (ok) io_uring_queue_exit(&ring);
  }
};

// Sets up a ring with the cheapest completion mode the kernel accepts.
int InitRing(Ring* r, unsigned entries) {
  const unsigned flag_sets[] = {
      IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_COOP_TASKRUN | IORING_SETUP_DEFER_TASKRUN,
      IORING_SETUP_COOP_TASKRUN, 0};
  int ret = -EINVAL;
  for (unsigned flags : flag_sets) {
    io_uring_params params{};
    params.flags = flags;
    ret = io_uring_queue_init_params(entries, &r->ring, &params);
    if (ret == 0) {
      r->ok = true;
      return 0;
    }
    if (ret != -EINVAL) break;
  }
  return ret;
}

Status LoadRun::RunUring() {
  const unsigned depth = options_.queue_depth;
  Ring ring;
  if (int ret = InitRing(&ring, depth); ret < 0) {
    AddFallback(std::string("io_uring unavailable (io_uring_queue_init: ") + std::strerror(-ret) +
                "; see /proc/sys/kernel/io_uring_disabled and seccomp): pread");
    return RunPread();
  }
  used_uring_ = true;
  std::vector<iovec> pieces;
  for (uint64_t off = 0; off < region_size_; off += options_.max_registered_buffer) {
    pieces.push_back({region_ + off, std::min(options_.max_registered_buffer, region_size_ - off)});
  }
  bool fixed = true;
  if (int ret = io_uring_register_buffers(&ring.ring, pieces.data(),
                                          static_cast<unsigned>(pieces.size()));
      ret < 0) {
    fixed = false;
    AddFallback(std::string("cannot register the region with io_uring (") + std::strerror(-ret) +
                (ret == -ENOMEM ? "; RLIMIT_MEMLOCK too low? raise `ulimit -l`" : "") +
                "): unregistered reads");
  }
  ring.registered = fixed;
  std::vector<Chunk> slots(depth);
  std::vector<unsigned> free_slots;
  for (unsigned i = depth; i > 0; --i) free_slots.push_back(i - 1);
  Status error;
  Chunk c;
  while (true) {
    while (error.ok() && !free_slots.empty() && Next(&c)) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring.ring);
      if (sqe == nullptr) {
        retries_.push_front(c);
        break;
      }
      const unsigned slot = free_slots.back();
      free_slots.pop_back();
      c.direct = files_[c.file].direct;
      slots[slot] = c;
      const int fd = files_[c.file].fd.get();
      const auto len = static_cast<unsigned>(c.length);
      if (fixed) {
        const int index = static_cast<int>((c.dest - region_) / options_.max_registered_buffer);
        io_uring_prep_read_fixed(sqe, fd, c.dest, len, c.offset, index);
      } else {
        io_uring_prep_read(sqe, fd, c.dest, len, c.offset);
      }
      io_uring_sqe_set_data64(sqe, slot);
    }
    if (free_slots.size() == depth && io_uring_sq_ready(&ring.ring) == 0) break;
    int ret = io_uring_submit_and_wait(&ring.ring, 1);
    if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY) {
      // The ring is unusable. Requests already in flight hold their pages pinned and are
      // cancelled when the ring is torn down.
      return ErrnoStatus("io_uring_submit_and_wait", -ret);
    }
    unsigned head;
    unsigned seen = 0;
    io_uring_cqe* cqe;
    io_uring_for_each_cqe(&ring.ring, head, cqe) {
      const auto slot = static_cast<unsigned>(io_uring_cqe_get_data64(cqe));
      Status s = Complete(slots[slot], cqe->res);
      if (error.ok() && !s.ok()) error = s;
      free_slots.push_back(slot);
      ++seen;
    }
    io_uring_cq_advance(&ring.ring, seen);
    Report();
  }
  return error;
}

Status LoadRun::RunPread() {
  Chunk c;
  while (Next(&c)) {
    OpenFile& f = files_[c.file];
    c.direct = f.direct;
    ssize_t n = ::pread(f.fd.get(), c.dest, c.length, static_cast<off_t>(c.offset));
    BATON_RETURN_IF_ERROR(Complete(c, n < 0 ? -errno : n));
    Report();
  }
  return OkStatus();
}

Status LoadRun::ReadTails() {
  for (const Chunk& c : tails_) {
    BATON_RETURN_IF_ERROR(FinishBuffered(c));
    Report();
  }
  return OkStatus();
}

void LoadRun::Finish() {
  for (auto& [p, n] : zero_) std::memset(p, 0, n);
}

}  // namespace

Result<LoadStats> UringLoader::Load(const std::vector<ReadJob>& jobs, uint8_t* region,
                                    uint64_t region_size) {
  const Clock& clock = options_.clock != nullptr ? *options_.clock : RealClock::Get();
  const TimePoint start = clock.Now();
  LoadRun run(options_, region, region_size);
  BATON_RETURN_IF_ERROR(run.Plan(jobs));
  if (options_.use_uring) {
    BATON_RETURN_IF_ERROR(run.RunUring());
  } else {
    BATON_RETURN_IF_ERROR(run.RunPread());
  }
  BATON_RETURN_IF_ERROR(run.ReadTails());
  run.Finish();
  LoadStats stats;
  stats.bytes = run.bytes();
  stats.seconds = MillisBetween(start, clock.Now()) / 1000.0;
  stats.gbps = stats.seconds > 0 ? static_cast<double>(stats.bytes) / stats.seconds / 1e9 : 0;
  stats.method =
      std::string(run.used_uring() ? "io_uring" : "pread") + (run.all_direct() ? "+O_DIRECT" : "");
  stats.fallback_reason = run.fallback_reason();
  BATON_LOG(DEBUG, kComponent) << "read " << stats.bytes << " bytes in " << stats.seconds << " s ("
                               << stats.gbps << " GB/s) with " << stats.method;
  return stats;
}

}  // namespace baton
