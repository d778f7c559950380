#include "proto/transport/liveness_page.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <string>
#include <system_error>
#include <utility>

namespace baton::proto {
namespace {

constexpr size_t kPageBytes = 4096;
// The most a page may be: 4 KiB rounds up to the system's page (64 KiB on some arm64 kernels).
size_t MaxPageBytes() {
  const long page = ::sysconf(_SC_PAGESIZE);
  return std::max(kPageBytes, page > 0 ? static_cast<size_t>(page) : kPageBytes);
}
// How long the watch sleeps in one wait at most: the longest a death marked without a
// waiter to wake (the owner died before the watch first waited) goes unseen.
constexpr long kPollNs = 100'000'000;
// A word that keeps changing under the watch (a page the engine scribbles on) is looked at
// at most this many times before a pause of a millisecond, instead of in a busy loop.
constexpr int kChangesBeforeBackoff = 16;

// The robust futex protocol's word is the mutex's first member (glibc's __lock): the
// kernel marks FUTEX_OWNER_DIED there, at the offset glibc registers with set_robust_list.
static_assert(offsetof(pthread_mutex_t, __data.__lock) == 0);
static_assert(sizeof(pthread_mutex_t) <= kPageBytes);

pthread_mutex_t* MutexAt(const Mapping& mapping) {
  return reinterpret_cast<pthread_mutex_t*>(mapping.data());
}

Status InitMutex(pthread_mutex_t* mutex) {
  pthread_mutexattr_t attr;
  if (int rc = ::pthread_mutexattr_init(&attr); rc != 0) return ErrnoStatus("mutexattr", rc);
  int rc = ::pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  if (rc == 0) rc = ::pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  if (rc == 0) rc = ::pthread_mutex_init(mutex, &attr);
  ::pthread_mutexattr_destroy(&attr);
  if (rc != 0) return ErrnoStatus("initializing the liveness mutex", rc);
  return OkStatus();
}

// FUTEX_WAIT on a shared mapping (the kernel wakes shared waiters of a robust futex).
void FutexWait(uint32_t* word, uint32_t expected) {
  const timespec timeout{.tv_sec = 0, .tv_nsec = kPollNs};
  (void)::syscall(SYS_futex, word, FUTEX_WAIT, expected, &timeout, nullptr, 0);
}

void FutexWakeAll(uint32_t* word) {
  (void)::syscall(SYS_futex, word, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

}  // namespace

// --- LivenessPage -------------------------------------------------------------------------------

Result<LivenessPage> LivenessPage::Create() {
  LivenessPage page;
  BATON_ASSIGN_OR_RETURN(
      page.memory_, SharedMemory::Create(
                        {.name = "baton-liveness", .size = kPageBytes, .try_huge_pages = false}));
  BATON_RETURN_IF_ERROR(page.memory_.Seal(Sealing::kFixedSize));
  BATON_ASSIGN_OR_RETURN(page.mapping_, page.memory_.Map(Protection::kReadWrite));
  if (::madvise(page.mapping_.data(), page.mapping_.size(), MADV_DONTFORK) != 0) {
    return ErrnoStatus("madvise(MADV_DONTFORK) of the liveness page", errno);
  }
  BATON_RETURN_IF_ERROR(InitMutex(MutexAt(page.mapping_)));
  return page;
}

LivenessPage::LivenessPage(LivenessPage&& other) noexcept
    : memory_(std::move(other.memory_)),
      mapping_(std::move(other.mapping_)),
      held_(std::exchange(other.held_, false)) {}

LivenessPage& LivenessPage::operator=(LivenessPage&& other) noexcept {
  if (this != &other) {
    Abandon();
    memory_ = std::move(other.memory_);
    mapping_ = std::move(other.mapping_);
    held_ = std::exchange(other.held_, false);
  }
  return *this;
}

LivenessPage::~LivenessPage() { Abandon(); }

void LivenessPage::Abandon() {
  // A held mutex stays on its thread's robust list, which the kernel walks when the thread
  // ends: its page must stay mapped so that the kernel writes into it and nothing else.
  if (held_) (void)new Mapping(std::move(mapping_));
  held_ = false;
}

Status LivenessPage::Hold() {
  if (!valid()) return FailedPrecondition("no liveness page");
  if (held_) return OkStatus();
  int rc = ::pthread_mutex_lock(MutexAt(mapping_));
  // A previous holder of this engine's own page died: the mutex is this thread's now.
  if (rc == EOWNERDEAD) rc = ::pthread_mutex_consistent(MutexAt(mapping_));
  if (rc != 0) return ErrnoStatus("locking the liveness mutex", rc);
  held_ = true;
  return OkStatus();
}

void LivenessPage::Release() {
  if (!held_) return;
  (void)::pthread_mutex_unlock(MutexAt(mapping_));
  held_ = false;
}

// --- LivenessWatch ------------------------------------------------------------------------------

Result<std::unique_ptr<LivenessWatch>> LivenessWatch::Start(UniqueFd fd) {
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus("fstat of the liveness page", errno);
  if (!S_ISREG(st.st_mode) || st.st_size < static_cast<off_t>(sizeof(pthread_mutex_t)) ||
      st.st_size > static_cast<off_t>(MaxPageBytes())) {
    return InvalidArgument("the liveness page is no memfd of one page at most (" +
                           std::to_string(MaxPageBytes()) + " bytes; size " +
                           std::to_string(st.st_size) + ")");
  }
  const int seals = ::fcntl(fd.get(), F_GET_SEALS);
  constexpr int kNeeded = F_SEAL_SHRINK | F_SEAL_GROW;
  if (seals < 0 || (seals & kNeeded) != kNeeded) {
    return InvalidArgument("the liveness page is not sealed against resizing");
  }
  BATON_ASSIGN_OR_RETURN(SharedMemory memory, SharedMemory::Import(std::move(fd)));
  BATON_ASSIGN_OR_RETURN(Mapping mapping, memory.Map(Protection::kReadWrite));
  UniqueFd event(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!event) return ErrnoStatus("eventfd for the liveness watch", errno);
  std::unique_ptr<LivenessWatch> watch(new LivenessWatch(std::move(mapping), std::move(event)));
  try {
    watch->thread_ = std::thread([w = watch.get()] {
      w->Run();
      w->finished_.store(true);
      w->exited_.store(true);
    });
  } catch (const std::system_error& e) {
    return Status(StatusCode::kResourceExhausted,
                  std::string("starting the liveness watch: ") + e.what());
  }
  return watch;
}

LivenessWatch::LivenessWatch(Mapping mapping, UniqueFd event)
    : mapping_(std::move(mapping)), event_(std::move(event)) {}

LivenessWatch::~LivenessWatch() {
  stop_.store(true);
  __atomic_store_n(&stop_word_, 1, __ATOMIC_SEQ_CST);
  // A wake that comes between the thread's look at stop_ and its wait on the page's word is
  // lost, and that wait would last its whole timeout: wake until the thread is out.
  while (thread_.joinable() && !exited_.load()) {
    FutexWakeAll(word());
    FutexWakeAll(&stop_word_);
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  if (thread_.joinable()) thread_.join();
}

uint32_t* LivenessWatch::word() const { return reinterpret_cast<uint32_t*>(mapping_.data()); }

void LivenessWatch::Run() {
  std::atomic_ref<uint32_t> word(*this->word());
  bool held_seen = false;
  int changes = 0;
  // Counts a look that did not wait (the word had changed); pauses after kChangesBeforeBackoff.
  auto churn = [&changes] {
    if (++changes < kChangesBeforeBackoff) return;
    changes = 0;
    ::usleep(1000);
  };
  while (!stop_.load()) {
    uint32_t v = word.load();
    if ((v & FUTEX_OWNER_DIED) != 0) {
      const uint64_t one = 1;
      (void)!::write(event_.get(), &one, sizeof(one));
      // The thread ends only when the watch is destroyed: a thread's exit costs a fraction
      // of a millisecond of CPU, better spent by the failover that has just begun.
      finished_.store(true);
      while (!stop_.load()) FutexWait(reinterpret_cast<uint32_t*>(&stop_word_), 0);
      return;
    }
    if ((v & FUTEX_TID_MASK) == 0) {
      if (held_seen) return;  // released: the session closed cleanly
    } else {
      held_seen = true;
      // A waiter's mark, as glibc's own waiters set it: the kernel wakes a waiter of a dead
      // owner's futex only when the word says there is one.
      if ((v & FUTEX_WAITERS) == 0) {
        if (!word.compare_exchange_strong(v, v | FUTEX_WAITERS)) {
          churn();
          continue;
        }
        v |= FUTEX_WAITERS;
      }
    }
    FutexWait(this->word(), v);
    const uint32_t now = word.load();
    if (now != v && (now & FUTEX_OWNER_DIED) == 0) churn();
  }
}

}  // namespace baton::proto
