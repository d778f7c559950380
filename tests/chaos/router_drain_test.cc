// baton-router stopped with SIGTERM under load loses no request (docs/router.md, Stopping).
// Clients send through the router while a load balancer polls its /health; on SIGTERM the
// router says "draining" there, the balancer stops sending it new requests, and after
// --drain-delay-ms the router stops accepting; the requests in flight (streamed and not)
// finish there, each 200 and equal to its reference, and the router exits 0 once no client
// connection is left.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>

#include "tests/chaos/chaos_harness.h"
#include "tests/chaos/router_load.h"
#include "tests/chaos/router_stream_support.h"

namespace baton::chaos {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

TEST(RouterDrain, SigtermUnderLoadLosesNoRequest) {
  ChaosCluster cluster(RefenginePair());
  // The delay must let the balancer see "draining" (and the clients stop) before the router
  // stops accepting, even on a loaded host.
  RouterProcess router({"--controller", cluster.socket(), "--drain-delay-ms", "3000"},
                       cluster.dir(), "router.log");
  ASSERT_TRUE(router.ready()) << router.Log();
  std::vector<json> requests;
  std::vector<StreamOutput> want;
  References(router.port(), "drain", 12, &requests, &want);

  std::atomic<bool> balanced{true};  // the load balancer still sends to this router
  std::atomic<bool> saw_draining{false};
  std::atomic<int> next{0}, ok{0}, spanning{0};
  std::atomic<Clock::rep> term_at{0};
  std::mutex mu;
  std::vector<std::string> failures;
  std::thread balancer([&] {
    while (balanced) {
      const Reply health =
          Fetch(router.port(), http::verb::get, "/health", "", std::chrono::seconds(5));
      if (health.status == 503 && health.body.find("\"draining\"") != std::string::npos) {
        saw_draining = true;
        balanced = false;
      }
      std::this_thread::sleep_for(milliseconds(20));
    }
  });
  std::vector<std::thread> clients;
  for (int c = 0; c < 4; ++c) {
    clients.emplace_back([&] {
      while (balanced) {
        const int i = next++ % static_cast<int>(requests.size());
        const Clock::rep start = Clock::now().time_since_epoch().count();
        const Reply reply =
            Fetch(router.port(), http::verb::post, "/v1/completions", requests[i].dump());
        const Clock::rep end = Clock::now().time_since_epoch().count();
        StreamOutput got;
        if (reply.status != 200) {
          got.error = "HTTP " + std::to_string(reply.status);
        } else {
          got = i % 2 == 1 ? ParseStream(reply.body) : ParseWhole(reply.body);
        }
        if (got.error.empty() && got.text == want[i].text && got.token_ids == want[i].token_ids) {
          ++ok;
          if (term_at != 0 && start < term_at && end > term_at) ++spanning;
          continue;
        }
        std::lock_guard<std::mutex> lock(mu);
        failures.push_back("request " + std::to_string(i) + ": " + got.error + " " + reply.error);
      }
    });
  }
  std::this_thread::sleep_for(milliseconds(800));
  term_at = Clock::now().time_since_epoch().count();
  const int code = router.Stop(SIGTERM, milliseconds(40'000));
  balanced = false;
  for (std::thread& t : clients) t.join();
  balancer.join();

  EXPECT_TRUE(failures.empty()) << failures.size() << " requests lost, e.g. " << failures[0] << "\n"
                                << router.Log();
  EXPECT_TRUE(saw_draining) << "/health never said draining\n" << router.Log();
  EXPECT_GT(spanning.load(), 0) << "no request was in flight at the SIGTERM";
  EXPECT_EQ(code, 0) << router.Log();
  const std::string log = ReadFile(cluster.dir() + "/router.log");
  EXPECT_NE(log.find("drained: no client connection left"), std::string::npos) << router.Log();
  std::printf("{\"answered\": %d, \"in_flight_at_sigterm\": %d, \"lost\": %zu}\n", ok.load(),
              spanning.load(), failures.size());
}

}  // namespace
}  // namespace baton::chaos
