#include "controller/epoch_journal.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/failpoint.h"
#include "base/io/file_lock.h"
#include "base/io/private_dir.h"
#include "base/io/small_file.h"
#include "base/log.h"
#include "proto/wire/crc32c.h"

namespace baton {
namespace {

constexpr uint32_t kMagic = 0x4a504542;  // "BEPJ" little-endian
constexpr uint32_t kVersion = 1;
constexpr size_t kCrcOffset = 16;
constexpr size_t kMaxReadBytes = 4096;

void PutLe(std::string* out, size_t offset, uint64_t value, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) (*out)[offset + i] = static_cast<char>(value >> (8 * i));
}

uint64_t GetLe(const std::string& in, size_t offset, size_t bytes) {
  uint64_t value = 0;
  for (size_t i = 0; i < bytes; ++i) {
    value |= static_cast<uint64_t>(static_cast<uint8_t>(in[offset + i])) << (8 * i);
  }
  return value;
}

Status SyncDirectory(const std::string& path) {
  UniqueFd dir(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir) return ErrnoStatus("open directory " + path, errno);
  if (::fsync(dir.get()) != 0) return ErrnoStatus("fsync directory " + path, errno);
  return OkStatus();
}

// A journal in memory-backed storage (tmpfs: /tmp on many systems, /run) is lost at reboot,
// and epochs then start again from 0.
void WarnIfVolatile(const std::string& dir) {
  struct statfs fs;
  if (::statfs(dir.c_str(), &fs) == 0 && fs.f_type == TMPFS_MAGIC) {
    BATON_LOG(WARN, "journal") << "the epoch journal's directory " << dir
                               << " is on tmpfs: epochs restart at 0 after a reboot; set "
                                  "controller.state_dir to persistent storage";
  }
}

}  // namespace

std::string EpochJournal::EncodeRecord(uint64_t epoch) {
  std::string out(kRecordSize, '\0');
  PutLe(&out, 0, kMagic, 4);
  PutLe(&out, 4, kVersion, 4);
  PutLe(&out, 8, epoch, 8);
  PutLe(&out, kCrcOffset, proto::Crc32c(out.data(), kCrcOffset), 4);
  return out;
}

Result<uint64_t> EpochJournal::DecodeRecord(const std::string& bytes, const std::string& where) {
  if (bytes.size() != kRecordSize) {
    return DataLoss(
        "epoch journal " + where + ": record is " +
        (bytes.size() > kMaxReadBytes ? std::string("over 4096") : std::to_string(bytes.size())) +
        " bytes, expected " + std::to_string(kRecordSize));
  }
  if (GetLe(bytes, 0, 4) != kMagic) return DataLoss("epoch journal " + where + ": bad magic");
  const uint64_t version = GetLe(bytes, 4, 4);
  if (version != kVersion) {
    return DataLoss("epoch journal " + where + ": unsupported version " + std::to_string(version));
  }
  const uint32_t want = proto::Crc32c(bytes.data(), kCrcOffset);
  if (GetLe(bytes, kCrcOffset, 4) != want) {
    return DataLoss("epoch journal " + where + ": CRC mismatch (record corrupt)");
  }
  if (GetLe(bytes, 20, 4) != 0) {
    return DataLoss("epoch journal " + where + ": nonzero padding (record corrupt)");
  }
  return GetLe(bytes, 8, 8);
}

Result<EpochJournal> EpochJournal::Open(const std::string& path, uint64_t reserve_batch) {
  if (path.empty()) return InvalidArgument("epoch journal path is empty");
  if (reserve_batch == 0) return InvalidArgument("epoch journal: a reserve batch of 0 epochs");
  const std::string dir_path = ParentDir(path);
  UniqueFd dir(::open(dir_path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir) return ErrnoStatus("open epoch journal directory " + dir_path, errno);
  struct stat lock_st;
  const bool lock_existed = ::stat((path + ".lock").c_str(), &lock_st) == 0;
  BATON_ASSIGN_OR_RETURN(UniqueFd lock, LockFile(path + ".lock", "epoch journal " + path));
  EpochJournal journal(path, std::move(dir), std::move(lock), reserve_batch);
  WarnIfVolatile(dir_path);

  const std::string tmp = path + ".tmp";
  if (::unlink(tmp.c_str()) == 0) {
    BATON_LOG(WARN, "journal") << "discarded uncommitted " << tmp;
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) return ErrnoStatus("stat " + path, errno);
    if (lock_existed) {
      BATON_LOG(ERROR, "journal") << path << " is missing but its lock file is there: a "
                                  << "controller ran with this state directory before; epochs "
                                  << "restart at 0 (engines of that run must all be gone)";
    }
    BATON_RETURN_IF_ERROR(journal.Commit(0));
    // The state directory itself may be new: its entry in its parent is made durable too.
    BATON_RETURN_IF_ERROR(SyncDirectory(ParentDir(dir_path)));
    BATON_LOG(INFO, "journal") << "created " << path << " at epoch 0";
    return journal;
  }
  BATON_ASSIGN_OR_RETURN(std::string bytes, ReadSmallFile(path, kMaxReadBytes));
  BATON_ASSIGN_OR_RETURN(uint64_t epoch, DecodeRecord(bytes, path));
  journal.current_ = epoch;
  journal.reserved_ = epoch;
  journal.attempted_ = epoch;
  BATON_LOG(INFO, "journal") << "opened " << path << " at epoch " << epoch;
  return journal;
}

Status EpochJournal::Commit(uint64_t epoch) {
  last_write_ = WriteRecord(epoch);
  if (!last_write_.ok()) ++write_failures_;
  return last_write_;
}

Status EpochJournal::WriteRecord(uint64_t epoch) {
  const std::string tmp = path_ + ".tmp";
  {
    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | kPrivateFileFlags, 0600));
    if (!fd) return PrivateFileOpenError("create", tmp, errno);
    BATON_RETURN_IF_ERROR(WriteAll(fd.get(), EncodeRecord(epoch), tmp));
    if (::fsync(fd.get()) != 0) return ErrnoStatus("fsync " + tmp, errno);
  }
  BATON_FAILPOINT("mid_journal_write");  // the new record written, not yet renamed over
  if (::rename(tmp.c_str(), path_.c_str()) != 0) {
    return ErrnoStatus("rename " + tmp + " to " + path_, errno);
  }
  if (::fsync(dir_.get()) != 0) return ErrnoStatus("fsync directory of " + path_, errno);
  return OkStatus();
}

Status EpochJournal::Reserve(uint64_t through) {
  const uint64_t base = std::max({attempted_, current_, through - 1});
  if (base > UINT64_MAX - reserve_batch_) {
    return Internal("epoch journal " + path_ + ": epoch space exhausted");
  }
  const uint64_t target = base + reserve_batch_;
  attempted_ = target;
  if (Status s = Commit(target); !s.ok()) {
    last_write_ = s.WithContext("reserving epochs through " + std::to_string(target));
    return last_write_;
  }
  reserved_ = target;
  BATON_LOG(DEBUG, "journal") << "epochs reserved through " << target;
  return OkStatus();
}

Result<uint64_t> EpochJournal::Advance() {
  if (current_ == UINT64_MAX) return Internal("epoch journal " + path_ + ": epoch space exhausted");
  const uint64_t next = current_ + 1;
  if (next > reserved_) BATON_RETURN_IF_ERROR(Reserve(next));
  current_ = next;
  return next;
}

Status EpochJournal::Replenish() {
  if (reserved_ - current_ >= reserve_batch_ / 2 && last_write_.ok()) return OkStatus();
  return Reserve(current_ + 1);
}

}  // namespace baton
