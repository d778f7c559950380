// Two real processes share a memfd passed over a proto Channel, and each sees the other's
// writes. The child is build/bin/baton_memfd_peer_helper (tests/proto/memfd_peer_helper_main.cc).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <cstring>
#include <fstream>
#include <string>

#include "proto/hello.h"
#include "proto/transport/listener.h"
#include "proto/transport/shared_memory.h"
#include "tests/proto/proto_test_util.h"

namespace baton::proto {
namespace {

using namespace std::chrono_literals;

uint8_t ParentByte(size_t i) { return static_cast<uint8_t>(i * 131 + 7); }
uint8_t ChildByte(size_t i) { return static_cast<uint8_t>(i * 29 + 3); }
constexpr uint64_t kSecondWrite = 0xC0FFEE0DDF00Dull;

// Owns the child process: kills and reaps it if the test ends early.
class Child {
 public:
  explicit Child(const std::string& socket_path) {
    const std::string helper = std::string(BATON_BIN_DIR) + "/baton_memfd_peer_helper";
    pid_ = ::fork();
    if (pid_ == 0) {
      ::execl(helper.c_str(), helper.c_str(), socket_path.c_str(), nullptr);
      std::fprintf(stderr, "exec %s: %s\n", helper.c_str(), std::strerror(errno));
      ::_exit(127);
    }
  }
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      Wait();
    }
  }
  pid_t pid() const { return pid_; }
  // The exit status (as waitpid reports it).
  int Wait() {
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    return status;
  }

 private:
  pid_t pid_ = -1;
};

TEST(MemfdPeerTest, TwoProcessesSeeEachOthersWrites) {
  testing::TempDir dir;
  const std::string path = dir.File("memfd.sock");
  boost::asio::io_context io;
  Result<Listener> listener = Listener::Bind(io, path);
  ASSERT_TRUE(listener.ok()) << listener.status().ToString();
  Child child(path);
  ASSERT_GT(child.pid(), 0);

  Result<Channel> channel = listener->Accept(10s);
  ASSERT_TRUE(channel.ok()) << channel.status().ToString();
  Result<PeerCredentials> cred = channel->peer_credentials();
  ASSERT_TRUE(cred.ok());
  EXPECT_EQ(cred->pid, child.pid());
  Result<AcceptedHello> hello = ServerHello(*channel, ServerHelloOptions{.server_name = "test"});
  ASSERT_TRUE(hello.ok()) << hello.status().ToString();
  EXPECT_EQ(hello->hello.peer_name, "memfd-peer");

  const size_t size = 4u << 20;
  Result<SharedMemory> shm = SharedMemory::Create(
      SharedMemoryOptions{.name = "proto-memfd-test", .size = size, .try_huge_pages = false});
  ASSERT_TRUE(shm.ok()) << shm.status().ToString();
  Result<Mapping> map = shm->Map(Protection::kReadWrite);
  ASSERT_TRUE(map.ok()) << map.status().ToString();
  for (size_t i = 0; i < size / 2; ++i) map->data()[i] = ParentByte(i);

  Result<UniqueFd> dup = shm->Dup();
  ASSERT_TRUE(dup.ok());
  ASSERT_TRUE(channel
                  ->Send(ShareMemory{.name = "proto-memfd-test",
                                     .size = size,
                                     .kind = static_cast<uint8_t>(MemoryKind::kMemfd),
                                     .huge_pages = shm->huge_pages(),
                                     .writable = true},
                         std::vector<int>{dup->get()})
                  .ok());
  dup->Reset();  // the child holds its own reference now

  Result<ReceivedMessage> reply = channel->Receive(10s);
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  Result<ShareMemoryAck> ack = reply->As<ShareMemoryAck>();
  ASSERT_TRUE(ack.ok()) << ack.status().ToString();
  ASSERT_TRUE(ack->mapped) << ack->detail;
  EXPECT_EQ(ack->name, "proto-memfd-test");
  size_t mismatches = 0;
  for (size_t i = size / 2; i < size; ++i) mismatches += map->data()[i] != ChildByte(i);
  EXPECT_EQ(mismatches, 0u) << "the child's writes are not visible to the parent";

  // A second write after the hand-off reaches the child through the same pages.
  std::memcpy(map->data(), &kSecondWrite, sizeof(kSecondWrite));
  ASSERT_TRUE(channel->Send(Heartbeat{.epoch = 1, .seq = 41}).ok());
  Result<ReceivedMessage> beat = channel->Receive(10s);
  ASSERT_TRUE(beat.ok()) << beat.status().ToString();
  EXPECT_EQ(beat->As<Heartbeat>()->seq, 42u);

  const int status = child.Wait();
  ASSERT_TRUE(WIFEXITED(status)) << "child status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// A hugetlb object of a GiB or more is mapped on a GiB boundary (so processes mapping it
// with the same protection share page tables); smaller ones and normal pages map anywhere.
TEST(SharedMemoryTest, GibHugetlbMappingsStartOnAGibBoundary) {
  Result<SharedMemory> memory =
      SharedMemory::Create({.name = "baton-align-test", .size = kPageTableShareSize});
  ASSERT_TRUE(memory.ok()) << memory.status().ToString();
  if (!memory->huge_pages()) {
    GTEST_SKIP() << "no 1 GiB of 2 MiB huge pages here: " << memory->fallback_reason();
  }
  for (Protection prot : {Protection::kReadOnly, Protection::kReadWrite, Protection::kReadOnly}) {
    Result<Mapping> m = memory->Map(prot);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(m->data()) % kPageTableShareSize, 0u);
    EXPECT_EQ(m->size(), kPageTableShareSize);
    if (prot == Protection::kReadWrite) {
      m->data()[kPageTableShareSize - 1] = 42;
    } else {
      EXPECT_EQ(m->data()[0], 0);
    }
  }
  Result<Mapping> again = memory->Map(Protection::kReadOnly, /*populate=*/true);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->data()[kPageTableShareSize - 1], 42) << "the same memory";
}

// Huge pages count as had only once reserved: an object larger than every huge page this
// machine has falls back to normal pages at Create, saying why, and maps. (Without the
// reservation, Create said "huge pages" and every Map failed with ENOMEM.)
TEST(SharedMemoryTest, MoreHugePagesThanTheMachineHasFallsBackAtCreate) {
  // The 2 MiB pool, whatever the default huge page size.
  const std::string pool = "/sys/kernel/mm/hugepages/hugepages-2048kB/";
  std::ifstream overcommit(pool + "nr_overcommit_hugepages");
  long surplus = 0;
  if (overcommit >> surplus && surplus > 0) {
    GTEST_SKIP() << "nr_overcommit_hugepages=" << surplus << " can grow the pool";
  }
  std::ifstream nr(pool + "nr_hugepages");
  long total = 0;
  if (!(nr >> total)) total = 0;  // no 2 MiB pool: nothing can be reserved
  const size_t size = (static_cast<size_t>(total) + 1) * kHugePageSize;
  Result<SharedMemory> memory = SharedMemory::Create({.name = "baton-reserve-test", .size = size});
  ASSERT_TRUE(memory.ok()) << memory.status().ToString();
  EXPECT_FALSE(memory->huge_pages());
  EXPECT_FALSE(memory->fallback_reason().empty());
  Result<Mapping> m = memory->Map(Protection::kReadWrite);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  m->data()[0] = 1;
  m->data()[size - 1] = 2;
  EXPECT_EQ(m->data()[size - 1], 2);
}

// A read-only seal leaves the owner's mapping writable and refuses every later write by
// anyone holding an fd: writable mappings, write(2), holes, resizing, more seals.
TEST(SharedMemoryTest, ReadOnlySealRefusesEveryLaterWrite) {
  for (bool huge : {false, true}) {
    Result<SharedMemory> memory =
        SharedMemory::Create({.name = "baton-seal-test", .size = 4u << 20, .try_huge_pages = huge});
    ASSERT_TRUE(memory.ok()) << memory.status().ToString();
    Result<Mapping> owner = memory->Map(Protection::kReadWrite);
    ASSERT_TRUE(owner.ok());
    ASSERT_TRUE(memory->Seal(Sealing::kReadOnly).ok());
    owner->data()[7] = 42;

    Result<UniqueFd> fd = memory->Dup();
    ASSERT_TRUE(fd.ok());
    Result<SharedMemory> peer = SharedMemory::Import(std::move(fd).value());
    ASSERT_TRUE(peer.ok());
    Result<Mapping> write = peer->Map(Protection::kReadWrite);
    EXPECT_FALSE(write.ok()) << "huge=" << huge;
    Result<Mapping> read = peer->Map(Protection::kReadOnly);
    ASSERT_TRUE(read.ok()) << read.status().ToString();
    EXPECT_EQ(read->data()[7], 42) << "the owner's write is visible";
    EXPECT_NE(::mprotect(read->data(), 4096, PROT_READ | PROT_WRITE), 0);
    const char byte = 1;
    EXPECT_NE(::pwrite(peer->fd(), &byte, 1, 0), 1);
    EXPECT_NE(::fallocate(peer->fd(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096), 0);
    EXPECT_NE(::ftruncate(peer->fd(), 0), 0);
    EXPECT_FALSE(peer->Seal(Sealing::kFixedSize).ok()) << "sealed for good";
    Result<unsigned> seals = peer->seals();
    ASSERT_TRUE(seals.ok());
    EXPECT_EQ(*seals & F_SEAL_FUTURE_WRITE, unsigned{F_SEAL_FUTURE_WRITE});
    EXPECT_EQ(read->data()[7], 42);
  }
}

// A fixed-size seal keeps the memory writable for every mapper but refuses resizing, which
// would take pages from under the other mappers (SIGBUS), and refuses further seals.
TEST(SharedMemoryTest, FixedSizeSealKeepsWritesAndRefusesResizing) {
  Result<SharedMemory> memory =
      SharedMemory::Create({.name = "baton-seal-test", .size = 1u << 20, .try_huge_pages = false});
  ASSERT_TRUE(memory.ok());
  ASSERT_TRUE(memory->Seal(Sealing::kFixedSize).ok());
  Result<UniqueFd> fd = memory->Dup();
  ASSERT_TRUE(fd.ok());
  Result<SharedMemory> peer = SharedMemory::Import(std::move(fd).value());
  ASSERT_TRUE(peer.ok());
  Result<Mapping> write = peer->Map(Protection::kReadWrite);
  ASSERT_TRUE(write.ok()) << write.status().ToString();
  write->data()[0] = 9;
  EXPECT_NE(::ftruncate(peer->fd(), 0), 0);
  EXPECT_NE(::ftruncate(peer->fd(), 2 << 20), 0);
  EXPECT_NE(::fcntl(peer->fd(), F_ADD_SEALS, F_SEAL_FUTURE_WRITE), 0);
  EXPECT_EQ(write->data()[0], 9);
}

}  // namespace
}  // namespace baton::proto
