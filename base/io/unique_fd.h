// UniqueFd: sole owner of one file descriptor; closes it on destruction.
//
// Move-only. Release() hands the descriptor to the caller without closing it. Every fd
// Baton opens (files, memfds, sockets, pidfds, eventfds) lives in a UniqueFd or in an
// object that owns one. Thread-compatible.
#pragma once

#include <utility>

namespace baton {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { Reset(); }

  UniqueFd(UniqueFd&& other) noexcept : fd_(other.Release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) Reset(other.Release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  explicit operator bool() const { return valid(); }

  // Gives up ownership; the caller must close the returned fd.
  int Release() { return std::exchange(fd_, -1); }
  // Closes the current fd (if any) and takes `fd`.
  void Reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Marks `fd` close-on-exec, so that processes the caller later starts (engines) do not
// inherit it. For descriptors made by libraries that open them without O_CLOEXEC (Asio's
// socket(), accept() and socketpair()). Returns false with errno set on failure.
bool SetCloseOnExec(int fd);

}  // namespace baton
