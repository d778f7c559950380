// LivenessPage and LivenessWatch: an engine's death seen as its threads leave, before the
// kernel tears its address space down.
//
// The engine's session thread holds a robust, process-shared mutex that lies in a small
// sealed memfd (LivenessPage) and sends the fd to the controller. When the engine's process
// dies (SIGKILL, a crash, an exit that skips closing its session), the kernel walks the
// robust-mutex list of each exiting thread (set_robust_list(2)): it marks the mutex's futex
// word FUTEX_OWNER_DIED and wakes a waiter. That happens as the holding thread leaves, before
// the last thread of the process unmaps its memory and closes its files; so the controller's
// LivenessWatch sees the death before the connection's EOF or the pidfd, by as long as that
// teardown takes (a millisecond or more for an engine with a few GiB mapped on a CPU host; on
// a GPU host, the CUDA context's teardown). A clean close releases the mutex: the watch
// reports nothing and ends.
//
// The page is the engine's: whatever it writes there can only get the engine itself fenced
// (a word marked dead) or leave its death to the EOF. The watch maps it only when sealed
// against resizing, so that the engine cannot take the page from under the controller.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "base/io/unique_fd.h"
#include "base/status.h"
#include "proto/transport/shared_memory.h"

namespace baton::proto {

// The engine's side: a page of one system page (4 KiB rounded up). Create() on any thread; Hold()
// and Release() on the thread that is to hold the mutex for the session's life (the SDK's heartbeat
// thread). Move-only.
class LivenessPage {
 public:
  // A memfd of a page (sealed: fixed size) holding one robust, process-shared mutex, mapped
  // read-write and left out of fork(2) children (MADV_DONTFORK).
  static Result<LivenessPage> Create();

  LivenessPage() = default;
  // A page destroyed (or assigned over) while held is left mapped: the mutex is still on
  // its thread's robust list, where the kernel finds it when the thread ends.
  ~LivenessPage();
  LivenessPage(LivenessPage&& other) noexcept;
  LivenessPage& operator=(LivenessPage&& other) noexcept;

  // Locks the mutex on the calling thread: it holds it until Release() or its death.
  Status Hold();
  // Unlocks it, on the thread that holds it; nothing when not held.
  void Release();

  bool valid() const { return mapping_.valid(); }
  int fd() const { return memory_.fd(); }

 private:
  void Abandon();

  SharedMemory memory_;
  Mapping mapping_;
  bool held_ = false;
};

// The controller's side: one thread per watched engine, parked in a futex wait; what it
// sees comes out as an eventfd that the controller's event loop waits on.
class LivenessWatch {
 public:
  // Maps the page of `fd` (a memfd sealed against shrinking and growing, at least one mutex
  // long and at most a system page) and starts the thread, which makes fd() readable once the
  // mutex's owner died, or ends quietly when the owner releases the mutex after holding it.
  // InvalidArgument for any other fd.
  static Result<std::unique_ptr<LivenessWatch>> Start(UniqueFd fd);
  ~LivenessWatch();  // stops the thread and joins it
  LivenessWatch(const LivenessWatch&) = delete;
  LivenessWatch& operator=(const LivenessWatch&) = delete;

  // An eventfd, readable once the owner died.
  int fd() const { return event_.get(); }
  // The watch is over: the death was seen (fd() readable) or the owner released the mutex
  // after holding it.
  bool finished() const { return finished_.load(); }

 private:
  LivenessWatch(Mapping mapping, UniqueFd event);
  void Run();
  uint32_t* word() const;

  Mapping mapping_;
  UniqueFd event_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> finished_{false};
  std::atomic<bool> exited_{false};  // Run has returned
  uint32_t stop_word_ = 0;           // a futex word of its own, for the thread that saw a death
  std::thread thread_;
};

}  // namespace baton::proto
