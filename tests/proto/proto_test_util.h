// Helpers shared by the proto tests: temporary socket paths, raw writes that bypass Channel
// (to put malformed frames and mismatched fds on the wire), hand-built frame headers, and a
// Hello whose role is any text.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "base/io/unique_fd.h"
#include "proto/messages.h"
#include "proto/wire/crc32c.h"
#include "proto/wire/frame.h"

namespace baton::proto::testing {

// Hello's wire layout with the role as free text, as a peer of another build (or a hostile
// one) may send it; proto::Hello only holds the roles there are.
struct RawHello {
  static constexpr MsgType kType = MsgType::kHello;
  uint16_t min_version = kProtocolVersionMin;
  uint16_t max_version = kProtocolVersionMax;
  std::string peer_name = {};
  std::string role = {};
  std::string launch_token = {};
  template <class A>
  void serialize(A& ar) {
    ar(min_version, max_version, peer_name, role, launch_token);
  }
};

// A pipe (close-on-exec); each end closes on destruction.
struct Pipe {
  Pipe() {
    int fds[2];
    EXPECT_EQ(::pipe2(fds, O_CLOEXEC), 0);
    read_end.Reset(fds[0]);
    write_end.Reset(fds[1]);
  }
  UniqueFd read_end;
  UniqueFd write_end;
};

// A fresh directory under /tmp (short enough for sun_path), removed on destruction.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/baton-proto-XXXXXX";
    const char* made = ::mkdtemp(tmpl);
    path_ = made != nullptr ? made : "/tmp";
  }
  ~TempDir() {
    std::error_code ec;
    if (path_ != "/tmp") std::filesystem::remove_all(path_, ec);
  }
  std::string File(std::string_view name) const { return path_ + "/" + std::string(name); }

 private:
  std::string path_;
};

// Writes `bytes` to `fd` in one sendmsg with `fds` attached; returns bytes sent or -errno.
inline ssize_t SendRaw(int fd, std::string_view bytes, const std::vector<int>& fds = {}) {
  iovec iov{.iov_base = const_cast<char*>(bytes.data()), .iov_len = bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(cmsg), fds.data(), sizeof(int) * fds.size());
  }
  const ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
  return n < 0 ? -errno : n;
}

// A frame with an arbitrary header; the CRC is computed over `payload` when `fix_crc`.
inline std::string RawFrame(FrameHeader header, std::string_view payload, bool fix_crc = true) {
  if (fix_crc) header.payload_crc32c = Crc32c(payload);
  std::string out(kFrameHeaderSize, '\0');
  WriteFrameHeader(header, reinterpret_cast<uint8_t*>(out.data()));
  out.append(payload);
  return out;
}

inline FrameHeader HeaderFor(uint16_t type, std::string_view payload, uint16_t fd_count = 0) {
  FrameHeader h;
  h.type = type;
  h.payload_length = static_cast<uint32_t>(payload.size());
  h.fd_count = fd_count;
  return h;
}

}  // namespace baton::proto::testing
