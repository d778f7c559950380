// baton-router's /metrics checked by Prometheus's own linter: `promtool check metrics` (from
// Debian's prometheus package) must accept the exposition with exit 0 and report no
// problem, after a mix of answered, refused and failed requests and with no primary at all.
// The router runs in process in front of a real baton-refengine (standalone, tiny model).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "router/router.h"
#include "standby/mkmodel/model_presets.h"
#include "tests/proto/http/http_test_client.h"
#include "tests/standby/tiny_engine.h"

namespace baton {
namespace {

using Json = nlohmann::json;

constexpr char kKey[] = "metrics-key";

std::string FindPromtool() {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string candidate = dir + "/promtool";
    if (!dir.empty() && ::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

struct Lint {
  int exit_code = -1;
  std::string output;  // promtool's stdout and stderr
};

// `promtool check metrics` over `text` (written to a file in `dir`, fed on stdin).
Lint CheckMetrics(const std::string& promtool, const std::string& dir, const std::string& text) {
  const std::string file = dir + "/metrics.txt";
  std::ofstream(file) << text;
  const std::string cmd = "'" + promtool + "' check metrics < '" + file + "' 2>&1";
  Lint lint;
  std::FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return lint;
  char buf[4096];
  while (std::fgets(buf, sizeof(buf), pipe) != nullptr) lint.output += buf;
  const int status = ::pclose(pipe);
  lint.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return lint;
}

// A raw request (so that it can carry any header); the reply's status, the whole body read.
int Call(uint16_t port, const std::string& method, const std::string& target,
         const std::string& body, bool with_key) {
  TestHttpClient client(port);
  std::string req = method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  if (with_key) req += std::string("Authorization: Bearer ") + kKey + "\r\n";
  if (method == "POST") {
    req +=
        "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  }
  req += "\r\n" + body;
  if (!client.SendRaw(req)) return -1;
  const int status = client.ReadHeader();
  if (status > 0) {
    while (client.ReadMore()) {
    }
  }
  return status;
}

class MetricsPromtoolTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { engine_ = new TinyEngine("baton-promtool"); }
  static void TearDownTestSuite() {
    delete engine_;
    engine_ = nullptr;
  }
  void SetUp() override {
    promtool_ = FindPromtool();
    ASSERT_FALSE(promtool_.empty()) << "promtool not found: run scripts/install-deps";
    ASSERT_NE(engine_->port(), 0);
  }

  static std::unique_ptr<Router> StartRouter(RouterOptions options) {
    options.listen_port = 0;
    options.api_key = kKey;
    options.max_body_bytes = 4096;
    auto router = std::make_unique<Router>(std::move(options));
    Status st = router->Start();
    EXPECT_TRUE(st.ok()) << st.ToString();
    return router;
  }

  // Fetches /metrics and runs promtool on it: exit 0 and no problem reported.
  void ExpectCleanLint(uint16_t port) {
    TestHttpClient client(port);
    HttpReply metrics = client.Get("/metrics");
    ASSERT_EQ(metrics.status, 200) << metrics.body << metrics.error;
    EXPECT_EQ(metrics.content_type.rfind("text/plain", 0), 0u) << metrics.content_type;
    ASSERT_FALSE(metrics.body.empty());
    const Lint lint = CheckMetrics(promtool_, engine_->dir(), metrics.body);
    EXPECT_EQ(lint.exit_code, 0) << "promtool check metrics:\n"
                                 << lint.output << "\n/metrics was:\n"
                                 << metrics.body;
    EXPECT_EQ(lint.output, "") << "promtool reported problems; /metrics was:\n" << metrics.body;
  }

  std::string promtool_;
  static TinyEngine* engine_;
};

TinyEngine* MetricsPromtoolTest::engine_ = nullptr;

const Json kRequest = {{"model", "tiny"},
                       {"prompt", "Metrics, linted"},
                       {"max_tokens", 8},
                       {"seed", 3},
                       {"temperature", 0.7}};

TEST_F(MetricsPromtoolTest, AfterAnsweredRefusedAndFailedRequests) {
  RouterOptions options;
  options.backend = "127.0.0.1:" + std::to_string(engine_->port());
  auto router = StartRouter(options);
  const uint16_t port = router->port();
  Json stream = kRequest;
  stream["stream"] = true;
  Json bad_param = kRequest;
  bad_param["max_tokens"] = -1;
  Json big = kRequest;
  big["prompt"] = std::string(8192, 'x');
  EXPECT_EQ(Call(port, "POST", "/v1/completions", kRequest.dump(), true), 200);
  EXPECT_EQ(Call(port, "POST", "/v1/completions", stream.dump(), true), 200);
  EXPECT_EQ(Call(port, "GET", "/v1/models", "", true), 200);
  EXPECT_EQ(Call(port, "POST", "/v1/completions", kRequest.dump(), false), 401);
  EXPECT_EQ(Call(port, "POST", "/v1/completions", "{not json", true), 400);
  EXPECT_EQ(Call(port, "POST", "/v1/completions", bad_param.dump(), true), 400);
  EXPECT_EQ(Call(port, "POST", "/v1/completions", big.dump(), true), 413);
  EXPECT_EQ(Call(port, "GET", "/no/such/route", "", true), 404);
  EXPECT_EQ(Call(port, "GET", "/health", "", false), 200);
  ExpectCleanLint(port);
}

TEST_F(MetricsPromtoolTest, WithNoPrimary) {
  RouterOptions options;
  options.controller_socket = engine_->dir() + "/no-controller.sock";
  auto router = StartRouter(options);
  const uint16_t port = router->port();
  EXPECT_EQ(Call(port, "GET", "/health", "", false), 503);
  EXPECT_EQ(Call(port, "POST", "/v1/completions", kRequest.dump(), false), 401);
  ExpectCleanLint(port);
}

}  // namespace
}  // namespace baton
