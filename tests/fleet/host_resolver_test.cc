// HostResolver (fleet/host_resolver.h): a lookup that does not answer (a name server gone)
// costs the caller its timeout, not the resolver library's retries; it is never started twice
// while one runs, and its late answer serves the next call. Numeric hosts are not looked up.
#include "fleet/host_resolver.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>

namespace baton {
namespace {

using std::chrono::milliseconds;
using tcp = boost::asio::ip::tcp;

// A lookup held until the test releases it, answering 10.0.0.7.
struct HeldLookup {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> calls{0};
};

// The lookup holds `held` alive: its thread may outlive the test's resolver.
HostResolver::Lookup Held(std::shared_ptr<HeldLookup> held) {
  return [held](const std::string&, const std::string& port) -> Result<HostResolver::Endpoints> {
    ++held->calls;
    held->released.wait();
    return HostResolver::Endpoints{tcp::endpoint(boost::asio::ip::make_address("10.0.0.7"),
                                                 static_cast<uint16_t>(std::stoi(port)))};
  };
}

TEST(HostResolver, ALookupThatDoesNotAnswerCostsTheTimeoutAndIsNotStartedTwice) {
  auto held = std::make_shared<HeldLookup>();
  HostResolver resolver("etcd-1.example", "2379", Held(held));
  Result<HostResolver::Endpoints> first = resolver.Resolve(milliseconds(50));
  ASSERT_EQ(first.status().code(), StatusCode::kDeadlineExceeded) << first.status().ToString();
  EXPECT_NE(first.status().message().find("resolve etcd-1.example: no answer within 50 ms"),
            std::string::npos)
      << first.status().ToString();
  EXPECT_EQ(resolver.Resolve(milliseconds(20)).status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(resolver.lookups(), 1u) << "the lookup still running is waited for again";
  held->release.set_value();
  Result<HostResolver::Endpoints> late = resolver.Resolve(milliseconds(5000));
  ASSERT_TRUE(late.ok()) << late.status().ToString();
  ASSERT_EQ(late->size(), 1u);
  EXPECT_EQ((*late)[0].address().to_string(), "10.0.0.7");
  EXPECT_EQ((*late)[0].port(), 2379);
  EXPECT_EQ(held->calls, 1);
  // Taken: the next call looks the name up again (a DNS answer may change).
  ASSERT_TRUE(resolver.Resolve(milliseconds(5000)).ok());
  EXPECT_EQ(resolver.lookups(), 2u);
}

TEST(HostResolver, AResolverDestroyedDuringALookupLeavesItToEnd) {
  auto held = std::make_shared<HeldLookup>();
  {
    HostResolver resolver("etcd-1.example", "2379", Held(held));
    EXPECT_FALSE(resolver.Resolve(milliseconds(10)).ok());
  }
  held->release.set_value();  // the detached lookup ends on its own, holding what it uses
}

TEST(HostResolver, ANumericHostIsNotLookedUp) {
  HostResolver resolver("127.0.0.1", "2379", [](const std::string& host, const std::string&) {
    ADD_FAILURE() << "looked up " << host;
    return Result<HostResolver::Endpoints>(Unavailable("no"));
  });
  Result<HostResolver::Endpoints> r = resolver.Resolve(milliseconds(10));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)[0], tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 2379));
  EXPECT_EQ(resolver.lookups(), 0u);
  HostResolver v6("::1", "80");
  ASSERT_TRUE(v6.Resolve(milliseconds(10)).ok());
}

TEST(HostResolver, TheSystemLookupResolvesLocalhostAndRefusesAnUnknownName) {
  HostResolver local("localhost", "2379");
  Result<HostResolver::Endpoints> r = local.Resolve(milliseconds(5000));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_FALSE(r->empty());
  EXPECT_TRUE((*r)[0].address().is_loopback());
  HostResolver unknown("no-such-host.invalid", "2379");
  Result<HostResolver::Endpoints> none = unknown.Resolve(milliseconds(5000));
  EXPECT_FALSE(none.ok());
}

}  // namespace
}  // namespace baton
