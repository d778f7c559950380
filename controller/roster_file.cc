#include "controller/roster_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <string_view>
#include <utility>

#include "base/io/private_dir.h"
#include "base/io/small_file.h"
#include "proto/wire/crc32c.h"

namespace baton {
namespace {

constexpr size_t kMaxRosterBytes = 16 << 20;

uint32_t ChecksumOf(Roster roster) {
  roster.checksum = 0;
  return proto::Crc32c(EncodeRoster(roster));
}

// The roster's text with its checksum, encoded once: the CRC32C of the text with a checksum
// of 0, then written over that 0 (the top-level field, one space in).
std::string EncodeWithChecksum(Roster& roster) {
  roster.checksum = 0;
  std::string text = EncodeRoster(roster);
  roster.checksum = proto::Crc32c(text);
  constexpr std::string_view kZero = "\n \"checksum\": 0";
  const size_t at = text.find(kZero);
  if (at == std::string::npos) return EncodeRoster(roster);
  text.replace(at, kZero.size(), "\n \"checksum\": " + std::to_string(roster.checksum));
  return text;
}

// The roster in `path`: NotFound when there is no such file; an error saying why when it is
// not a whole roster.
Result<Roster> ReadSlot(const std::string& path) {
  if (::access(path.c_str(), F_OK) != 0 && errno == ENOENT) return NotFound(path + ": none");
  BATON_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path, kMaxRosterBytes));
  BATON_ASSIGN_OR_RETURN(Roster roster, DecodeRoster(text, path));
  if (roster.checksum != 0 && ChecksumOf(roster) != roster.checksum) {
    return DataLoss(path + ": the checksum does not hold (a write cut short)");
  }
  return roster;
}

Status PwriteAll(int fd, const std::string& bytes, const std::string& what) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n =
        ::pwrite(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ErrnoStatus("writing " + what, n < 0 ? errno : EIO);
    done += static_cast<size_t>(n);
  }
  return OkStatus();
}

}  // namespace

RosterFile::RosterFile(std::string state_dir) : state_dir_(std::move(state_dir)) {}

std::string RosterFile::SlotPath(int slot) const {
  return state_dir_ + (slot == 0 ? "/roster.json" : "/roster.1.json");
}

Result<std::optional<Roster>> RosterFile::Load() {
  std::optional<Roster> newest;
  std::string refused;
  bool any = false;
  for (int slot = 0; slot < 2; ++slot) {
    Result<Roster> r = ReadSlot(SlotPath(slot));
    if (!r.ok() && r.status().code() == StatusCode::kNotFound) continue;
    any = true;
    if (!r.ok()) {
      refused += (refused.empty() ? "" : "; ") + r.status().message();
      continue;
    }
    if (!newest.has_value() || r->sequence > newest->sequence) newest = *std::move(r);
  }
  if (newest.has_value()) {
    sequence_ = std::max(sequence_, newest->sequence);
    return newest;
  }
  if (!any) return std::optional<Roster>();
  return InvalidArgument(refused);
}

Status RosterFile::OpenSlot(int slot) {
  if (fds_[slot].valid()) return OkStatus();
  const std::string path = SlotPath(slot);
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | kPrivateFileFlags, 0600));
  if (!fd.valid()) return PrivateFileOpenError("opening roster", path, errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus("fstat " + path, errno);
  sizes_[slot] = static_cast<uint64_t>(st.st_size);
  fds_[slot] = std::move(fd);
  return OkStatus();
}

Status RosterFile::Save(Roster roster) {
  roster.sequence = sequence_ + 1;
  const int slot = static_cast<int>(roster.sequence % 2);
  BATON_RETURN_IF_ERROR(OpenSlot(slot));
  std::string text = EncodeWithChecksum(roster);
  if (text.size() < sizes_[slot]) text.append(sizes_[slot] - text.size(), ' ');
  BATON_RETURN_IF_ERROR(PwriteAll(fds_[slot].get(), text, SlotPath(slot)));
  sizes_[slot] = std::max<uint64_t>(sizes_[slot], text.size());
  sequence_ = roster.sequence;
  return OkStatus();
}

}  // namespace baton
