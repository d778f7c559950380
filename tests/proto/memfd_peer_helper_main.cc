// The child side of memfd_peer_test: connects to the test's socket, says hello, receives a
// memfd in a ShareMemory message, checks the parent's pattern in the first half, writes its
// own into the second half, acknowledges, then waits for a heartbeat announcing a second
// parent write and checks that too. Exit 0 on success; any failure prints why and exits 1.
//
//   baton_memfd_peer_helper SOCKET_PATH
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "proto/hello.h"
#include "proto/transport/listener.h"
#include "proto/transport/shared_memory.h"

namespace baton::proto {
namespace {

using namespace std::chrono_literals;

int Fail(const std::string& what) {
  std::fprintf(stderr, "memfd_peer_helper: %s\n", what.c_str());
  return 1;
}

uint8_t ParentByte(size_t i) { return static_cast<uint8_t>(i * 131 + 7); }
uint8_t ChildByte(size_t i) { return static_cast<uint8_t>(i * 29 + 3); }
constexpr uint64_t kSecondWrite = 0xC0FFEE0DDF00Dull;

int Run(const std::string& path) {
  boost::asio::io_context io;
  Result<Channel> channel = Connect(io, path, ChannelOptions{.label = "test parent"});
  if (!channel.ok()) return Fail(channel.status().ToString());
  Result<HelloAck> ack = ClientHello(
      *channel, ClientHelloOptions{.peer_name = "memfd-peer", .role = PeerRole::kEngine});
  if (!ack.ok()) return Fail("hello: " + ack.status().ToString());

  Result<ReceivedMessage> msg = channel->Receive(10s);
  if (!msg.ok()) return Fail("receive ShareMemory: " + msg.status().ToString());
  Result<ShareMemory> share = msg->As<ShareMemory>();
  if (!share.ok()) return Fail(share.status().ToString());
  if (msg->fds.size() != 1)
    return Fail("ShareMemory came with " + std::to_string(msg->fds.size()) + " fds");
  Result<SharedMemory> shm = SharedMemory::Import(std::move(msg->fds[0]));
  if (!shm.ok()) return Fail(shm.status().ToString());
  if (shm->size() < share->size) return Fail("memfd is smaller than the message says");
  Result<Mapping> map = shm->Map(share->writable ? Protection::kReadWrite : Protection::kReadOnly);
  if (!map.ok()) return Fail(map.status().ToString());

  const size_t half = share->size / 2;
  std::string detail;
  for (size_t i = 0; i < half && detail.empty(); ++i) {
    if (map->data()[i] != ParentByte(i)) {
      detail = "byte " + std::to_string(i) + " is " + std::to_string(map->data()[i]) +
               ", the parent wrote " + std::to_string(ParentByte(i));
    }
  }
  if (detail.empty()) {
    for (size_t i = half; i < share->size; ++i) map->data()[i] = ChildByte(i);
  }
  Status sent = channel->Send(
      ShareMemoryAck{.name = share->name, .mapped = detail.empty(), .detail = detail});
  if (!sent.ok()) return Fail(sent.ToString());
  if (!detail.empty()) return Fail(detail);

  Result<ReceivedMessage> beat = channel->Receive(10s);
  if (!beat.ok()) return Fail("receive Heartbeat: " + beat.status().ToString());
  Result<Heartbeat> hb = beat->As<Heartbeat>();
  if (!hb.ok()) return Fail(hb.status().ToString());
  uint64_t word = 0;
  std::memcpy(&word, map->data(), sizeof(word));
  if (word != kSecondWrite) return Fail("the parent's second write is not visible");
  sent = channel->Send(Heartbeat{.epoch = hb->epoch, .seq = hb->seq + 1});
  if (!sent.ok()) return Fail(sent.ToString());
  return 0;
}

}  // namespace
}  // namespace baton::proto

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s SOCKET_PATH\n", argv[0]);
    return 2;
  }
  ::alarm(30);  // never outlive a wedged test
  return baton::proto::Run(argv[1]);
}
