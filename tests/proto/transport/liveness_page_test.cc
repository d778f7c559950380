// LivenessPage and LivenessWatch with real processes: a holder killed with SIGKILL, a holder
// thread that ends while its process lives on, a clean release, and pages the watch refuses.
#include "proto/transport/liveness_page.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace baton::proto {
namespace {

using namespace std::chrono_literals;

template <typename T>
T Take(Result<T> r) {
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return std::move(r).value();
}

UniqueFd Dup(int fd) { return UniqueFd(::fcntl(fd, F_DUPFD_CLOEXEC, 0)); }

// Whether `fd` becomes readable within `wait`.
bool ReadableWithin(int fd, std::chrono::milliseconds wait) {
  pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
  return ::poll(&p, 1, static_cast<int>(wait.count())) == 1;
}

void WaitFinished(const LivenessWatch& watch) {
  for (int i = 0; i < 1000 && !watch.finished(); ++i) std::this_thread::sleep_for(10ms);
}

// A forked child that maps the page of `fd` and locks its mutex on a thread of its own.
// `thread_exits`: that thread then ends without unlocking while the process lives on;
// otherwise it holds the mutex until the process is killed. Kills and reaps it on destruction.
class Holder {
 public:
  Holder(int fd, bool thread_exits) {
    int ready[2];
    EXPECT_EQ(::pipe(ready), 0);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(ready[0]);
      void* page = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (page == MAP_FAILED) ::_exit(2);
      std::thread t([page, w = ready[1], thread_exits] {
        if (::pthread_mutex_lock(static_cast<pthread_mutex_t*>(page)) != 0) ::_exit(3);
        (void)!::write(w, "x", 1);
        // A thread that ends holding a robust mutex is a death: the holder that lives on
        // must keep its thread until the process is killed.
        while (!thread_exits) ::pause();
      });
      if (thread_exits) {
        t.join();  // the thread ended holding the mutex
      } else {
        t.detach();
      }
      while (true) ::pause();
    }
    ::close(ready[1]);
    char c = 0;
    EXPECT_EQ(::read(ready[0], &c, 1), 1) << "the holder did not lock the mutex";
    ::close(ready[0]);
  }
  ~Holder() {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
};

TEST(LivenessPage, AHolderKilledWithSigkillIsSeenDead) {
  LivenessPage page = Take(LivenessPage::Create());
  Holder holder(page.fd(), /*thread_exits=*/false);  // held before it is watched, as by the SDK
  std::unique_ptr<LivenessWatch> watch = Take(LivenessWatch::Start(Dup(page.fd())));
  EXPECT_FALSE(ReadableWithin(watch->fd(), 0ms));
  ASSERT_EQ(::kill(holder.pid(), SIGKILL), 0);
  EXPECT_TRUE(ReadableWithin(watch->fd(), 10s)) << "the death was not seen";
  WaitFinished(*watch);
  EXPECT_TRUE(watch->finished());
}

TEST(LivenessPage, TheDeathIsSeenAsTheThreadLeavesNotWhenTheProcessEnds) {
  LivenessPage page = Take(LivenessPage::Create());
  std::unique_ptr<LivenessWatch> watch = Take(LivenessWatch::Start(Dup(page.fd())));
  Holder holder(page.fd(), /*thread_exits=*/true);
  EXPECT_TRUE(ReadableWithin(watch->fd(), 10s)) << "the holding thread's end was not seen";
  int status = 0;
  EXPECT_EQ(::waitpid(holder.pid(), &status, WNOHANG), 0) << "its process still lives";
}

TEST(LivenessPage, AReleaseIsNoDeathAndEndsTheWatch) {
  LivenessPage page = Take(LivenessPage::Create());
  std::unique_ptr<LivenessWatch> watch = Take(LivenessWatch::Start(Dup(page.fd())));
  std::atomic<bool> held{false}, release{false};
  std::thread owner([&] {
    ASSERT_TRUE(page.Hold().ok());
    held.store(true);
    while (!release.load()) std::this_thread::sleep_for(1ms);
    page.Release();
  });
  while (!held.load()) std::this_thread::sleep_for(1ms);
  // The watch has seen the mutex held once it marked itself as a waiter.
  const uint32_t* word = nullptr;
  {
    void* p = ::mmap(nullptr, 4096, PROT_READ, MAP_SHARED, page.fd(), 0);
    ASSERT_NE(p, MAP_FAILED);
    word = static_cast<const uint32_t*>(p);
  }
  for (int i = 0; i < 1000 && (__atomic_load_n(word, __ATOMIC_SEQ_CST) & FUTEX_WAITERS) == 0; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_NE(__atomic_load_n(word, __ATOMIC_SEQ_CST) & FUTEX_WAITERS, 0u);
  release.store(true);
  owner.join();
  WaitFinished(*watch);
  EXPECT_TRUE(watch->finished());
  EXPECT_FALSE(ReadableWithin(watch->fd(), 0ms)) << "a release is no death";
  ::munmap(const_cast<uint32_t*>(word), 4096);
}

TEST(LivenessPage, AWatchOnAHeldPageStopsWhenDestroyed) {
  LivenessPage page = Take(LivenessPage::Create());
  Holder holder(page.fd(), /*thread_exits=*/false);
  std::unique_ptr<LivenessWatch> watch = Take(LivenessWatch::Start(Dup(page.fd())));
  watch.reset();  // joins its thread, parked in a futex wait
  SUCCEED();
}

TEST(LivenessPage, AWordMarkedDeadByItsEngineFencesOnlyThatEngine) {
  LivenessPage page = Take(LivenessPage::Create());
  void* p = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, page.fd(), 0);
  ASSERT_NE(p, MAP_FAILED);
  __atomic_store_n(static_cast<uint32_t*>(p), FUTEX_OWNER_DIED, __ATOMIC_SEQ_CST);
  std::unique_ptr<LivenessWatch> watch = Take(LivenessWatch::Start(Dup(page.fd())));
  EXPECT_TRUE(ReadableWithin(watch->fd(), 10s));
  ::munmap(p, 4096);
}

TEST(LivenessPage, PagesThatCouldBeTakenAwayAreRefused) {
  // An unsealed memfd: its owner could shrink it under the watch's mapping.
  UniqueFd unsealed(::memfd_create("unsealed", MFD_CLOEXEC));
  ASSERT_TRUE(unsealed);
  ASSERT_EQ(::ftruncate(unsealed.get(), 4096), 0);
  Result<std::unique_ptr<LivenessWatch>> w = LivenessWatch::Start(std::move(unsealed));
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(w.status().message().find("not sealed"), std::string::npos) << w.status().ToString();
  // Not a file at all.
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  ::close(fds[1]);
  w = LivenessWatch::Start(UniqueFd(fds[0]));
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
  // Too large to be a page.
  UniqueFd large(::memfd_create("large", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_EQ(::ftruncate(large.get(), 1 << 20), 0);
  ASSERT_EQ(::fcntl(large.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  w = LivenessWatch::Start(std::move(large));
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace baton::proto
