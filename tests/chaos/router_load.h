// Load through baton-router for tests/chaos: reference outputs taken with no fault, and
// clients that keep sending those requests while a fault (a kill, a switch-over, an upgrade)
// runs, checking that every answer is 200 and equal to its reference.
//
// Header-only test support, like router_stream_support.h. Main test thread only (LoadAround
// starts and joins its own client threads).
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/chaos/router_stream_support.h"

namespace baton::chaos {

// `count` distinct requests (half streamed) and their outputs through `port` with no fault.
inline void References(uint16_t port, const std::string& tag, int count,
                       std::vector<json>* requests, std::vector<StreamOutput>* want) {
  for (int i = 0; i < count; ++i) {
    json r = {{"model", kRouterTestModel},
              {"prompt", tag + " #" + std::to_string(i)},
              {"seed", 500 + i},
              {"temperature", 0.7},
              {"max_tokens", 8 + i % 9}};
    if (i % 2 == 1) r["stream"] = true;
    const Reply reply = Fetch(port, http::verb::post, "/v1/completions", r.dump());
    ASSERT_EQ(reply.status, 200) << reply.body << reply.error;
    want->push_back(i % 2 == 1 ? ParseStream(reply.body) : ParseWhole(reply.body));
    ASSERT_TRUE(want->back().error.empty()) << want->back().error;
    requests->push_back(r);
  }
}

struct LoadResult {
  int done = 0;
  int spanning_fault = 0;  // requests in flight while `fault` ran
  int after_fault = 0;     // requests started after it returned
  std::vector<std::string> failures;
};

// 4 clients send `requests` round-robin through the routers on `ports` (client c through
// ports[c % size]) for 500 ms, while `fault` runs, and for 1.5 s after; every answer must be
// 200 and equal its reference.
inline LoadResult LoadAround(const std::vector<uint16_t>& ports, const std::vector<json>& requests,
                             const std::vector<StreamOutput>& want,
                             const std::function<void()>& fault) {
  using Clock = std::chrono::steady_clock;
  std::atomic<bool> stop{false};
  std::atomic<int> next{0}, done{0}, spanning{0}, after{0};
  std::atomic<Clock::rep> down_at{0}, up_at{0};
  std::mutex mu;
  LoadResult result;
  std::vector<std::thread> clients;
  for (int c = 0; c < 4; ++c) {
    const uint16_t port = ports[c % ports.size()];
    clients.emplace_back([&, port] {
      while (!stop) {
        const int i = next++ % static_cast<int>(requests.size());
        const Clock::rep start = Clock::now().time_since_epoch().count();
        const Reply reply = Fetch(port, http::verb::post, "/v1/completions", requests[i].dump());
        const Clock::rep end = Clock::now().time_since_epoch().count();
        ++done;
        if (down_at != 0 && end > down_at && (up_at == 0 || start < up_at)) ++spanning;
        if (up_at != 0 && start >= up_at) ++after;
        StreamOutput got;
        if (reply.status == 200) {
          got = i % 2 == 1 ? ParseStream(reply.body) : ParseWhole(reply.body);
        } else {
          got.error = "not 200";
        }
        if (reply.status == 200 && got.error.empty() && got.text == want[i].text &&
            got.token_ids == want[i].token_ids) {
          continue;
        }
        std::lock_guard<std::mutex> lock(mu);
        result.failures.push_back("request " + std::to_string(i) + ": HTTP " +
                                  std::to_string(reply.status) + " " + reply.error + " " +
                                  got.error +
                                  (got.error.empty() ? " output differs from the reference" : ""));
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  down_at = Clock::now().time_since_epoch().count();
  fault();
  up_at = Clock::now().time_since_epoch().count();
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  stop = true;
  for (std::thread& t : clients) t.join();
  result.done = done;
  result.spanning_fault = spanning;
  result.after_fault = after;
  return result;
}

inline LoadResult LoadAround(uint16_t port, const std::vector<json>& requests,
                             const std::vector<StreamOutput>& want,
                             const std::function<void()>& fault) {
  return LoadAround(std::vector<uint16_t>{port}, requests, want, fault);
}

inline void ExpectNoFailure(const LoadResult& r, RouterProcess& router) {
  std::string first;
  for (size_t k = 0; k < r.failures.size() && k < 10; ++k) first += "\n  " + r.failures[k];
  EXPECT_TRUE(r.failures.empty()) << r.failures.size() << " of " << r.done
                                  << " requests failed:" << first << "\nrouter log:\n"
                                  << router.Log();
  EXPECT_GT(r.spanning_fault, 0) << "no request was in flight during the fault";
  EXPECT_GT(r.after_fault, 0) << "no request was served after the fault";
  EXPECT_TRUE(router.Running());
}

}  // namespace baton::chaos
