// FakeEtcdMember: an HTTP front on loopback that stands in for one etcd member's JSON gateway.
// Each call (a POST to /v3/...) is answered by `answer` when it returns an answer (any status,
// any body: a broken member); otherwise it is forwarded to `upstream` (a real member's
// endpoint, tests/fleet/etcd_cluster.h) and the upstream's JSON answer, passed through `edit`
// when set, is sent back (an upstream error becomes HTTP 503).
//
// Header-only test support. Its own io thread runs the server; `answer` and `edit` run there.
// The destructor stops and joins it.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/beast/http/verb.hpp>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>

#include "fleet/json_http_client.h"
#include "proto/http/http_server.h"

namespace baton::fleet_test {

struct FakeAnswer {
  int status = 200;
  std::string body;
};

class FakeEtcdMember {
 public:
  using Answer = std::function<std::optional<FakeAnswer>(const std::string& path,
                                                         const nlohmann::json& request)>;
  using Edit = std::function<void(const std::string& path, const nlohmann::json& request,
                                  nlohmann::json* answer)>;

  FakeEtcdMember(const std::string& upstream, Answer answer, Edit edit = {})
      : answer_(std::move(answer)), edit_(std::move(edit)), server_(io_, HttpServerOptions{}) {
    if (!upstream.empty()) {
      auto c = JsonHttpClient::Create(upstream, std::chrono::seconds(5), nullptr);
      if (c.ok()) upstream_ = std::move(*c);
    }
    for (const char* path : {"/v3/kv/put", "/v3/kv/range", "/v3/kv/deleterange", "/v3/kv/txn",
                             "/v3/lease/grant", "/v3/lease/keepalive", "/v3/lease/revoke"}) {
      server_.Route(boost::beast::http::verb::post, path,
                    [this](std::shared_ptr<HttpExchange> x) { Serve(*x); });
    }
    listening_ = server_.Listen().ok();
    thread_ = std::thread([this] { io_.run(); });
  }
  ~FakeEtcdMember() {
    io_.stop();
    thread_.join();
  }
  FakeEtcdMember(const FakeEtcdMember&) = delete;
  FakeEtcdMember& operator=(const FakeEtcdMember&) = delete;

  bool listening() const { return listening_; }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(server_.port()); }

 private:
  void Serve(HttpExchange& x) {
    const std::string path(x.path());
    const nlohmann::json request = nlohmann::json::parse(x.request().body(), nullptr, false);
    if (answer_) {
      if (std::optional<FakeAnswer> a = answer_(path, request)) {
        return x.Respond(a->status, "application/json", a->body);
      }
    }
    if (upstream_ == nullptr) return x.RespondError(503, "no upstream");
    Result<nlohmann::json> r = upstream_->Post(path, request);
    if (!r.ok()) return x.RespondError(503, r.status().message());
    if (edit_) edit_(path, request, &*r);
    x.RespondJson(200, r->dump());
  }

  Answer answer_;
  Edit edit_;
  std::unique_ptr<JsonHttpClient> upstream_;
  boost::asio::io_context io_;
  HttpServer server_;
  bool listening_ = false;
  std::thread thread_;
};

}  // namespace baton::fleet_test
