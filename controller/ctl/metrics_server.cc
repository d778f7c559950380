#include "controller/ctl/metrics_server.h"

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "base/log.h"

namespace baton {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
using tcp = boost::asio::ip::tcp;

// One connection: read a request, write the answer, close.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, MetricsServer::Render render, std::shared_ptr<size_t> sessions)
      : stream_(std::move(socket)), render_(std::move(render)), sessions_(std::move(sessions)) {
    ++*sessions_;
  }
  ~Session() { --*sessions_; }

  void Run() {
    parser_.body_limit(kLimit);
    parser_.header_limit(kLimit);
    stream_.expires_after(std::chrono::seconds(5));
    http::async_read(
        stream_, buffer_, parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
          if (!ec) return self->Answer();
          if (ec == beast::error::timeout || ec == http::error::end_of_stream ||
              ec == boost::asio::error::eof) {
            return;  // nothing to answer
          }
          const bool big = ec == http::error::body_limit || ec == http::error::header_limit ||
                           ec == http::error::buffer_overflow;
          self->Reply(big ? http::status::payload_too_large : http::status::bad_request,
                      ErrorJson(big ? "the request exceeds 8192 bytes"
                                    : "malformed HTTP request: " + ec.message()),
                      "application/json", 11);
        });
  }

 private:
  static constexpr size_t kLimit = 8192;

  static std::string ErrorJson(const std::string& message) {
    nlohmann::json j = {{"error", {{"message", message}, {"type", "invalid_request_error"}}}};
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }

  void Answer() {
    const auto& req = parser_.get();
    const std::string_view target(req.target().data(), req.target().size());
    head_ = req.method() == http::verb::head;
    if (req.method() != http::verb::get && !head_) {
      response_.set(http::field::allow, "GET, HEAD");
      return Reply(http::status::method_not_allowed, ErrorJson("only GET /metrics is served"),
                   "application/json", req.version());
    }
    if (target.substr(0, target.find('?')) != "/metrics") {
      return Reply(http::status::not_found, ErrorJson("only GET /metrics is served"),
                   "application/json", req.version());
    }
    Reply(http::status::ok, render_(), "text/plain; version=0.0.4", req.version());
  }

  void Reply(http::status status, std::string body, const char* content_type, unsigned version) {
    response_.version(version);
    response_.keep_alive(false);
    response_.result(status);
    response_.set(http::field::content_type, content_type);
    response_.body() = std::move(body);
    response_.prepare_payload();
    if (head_) response_.body().clear();  // the headers alone, Content-Length the GET's
    http::async_write(stream_, response_, [self = shared_from_this()](beast::error_code, size_t) {
      beast::error_code ignored;
      self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    });
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_{4 * kLimit};  // bounded: chunk lines are not (Beast 1.74)
  http::request_parser<http::string_body> parser_;
  http::response<http::string_body> response_;
  MetricsServer::Render render_;
  std::shared_ptr<size_t> sessions_;
  bool head_ = false;  // a HEAD request: its answer carries no body
};

}  // namespace

MetricsServer::MetricsServer(boost::asio::io_context& io, Render render)
    : acceptor_(io), accept_retry_(io), render_(std::move(render)) {}

MetricsServer::~MetricsServer() {
  *alive_ = false;
  beast::error_code ignored;
  acceptor_.close(ignored);
}

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(boost::asio::io_context& io,
                                                            const std::string& host, int port,
                                                            Render render) {
  std::unique_ptr<MetricsServer> server(new MetricsServer(io, std::move(render)));
  beast::error_code ec;
  const auto address = boost::asio::ip::make_address(host, ec);
  if (ec) return InvalidArgument("metrics host '" + host + "': " + ec.message());
  const tcp::endpoint endpoint(address, static_cast<uint16_t>(port));
  server->acceptor_.open(endpoint.protocol(), ec);
  if (!ec) server->acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) server->acceptor_.bind(endpoint, ec);
  if (!ec) server->acceptor_.listen(16, ec);
  if (ec) {
    return Unavailable("metrics endpoint " + host + ":" + std::to_string(port) + ": " +
                       ec.message());
  }
  server->port_ = server->acceptor_.local_endpoint().port();
  BATON_LOG(INFO, "metrics") << "serving /metrics on " << host << ":" << server->port_;
  server->Accept();
  return server;
}

void MetricsServer::Accept() {
  std::weak_ptr<bool> alive = alive_;
  acceptor_.async_accept([this, alive](beast::error_code ec, tcp::socket socket) {
    if (alive.expired() || !acceptor_.is_open()) return;
    if (ec) return RetryAccept(ec);
    OnAccepted(std::move(socket));
    Accept();
  });
}

void MetricsServer::RetryAccept(const boost::system::error_code& ec) {
  // Out of fds, the connection stays queued and an accept at once fails again: a spin.
  const std::string why =
      ec.message() + "; retrying every " + std::to_string(kAcceptRetry.count()) + " ms";
  if (failed_accepts_++ == 0) {
    BATON_LOG(WARN, "metrics") << "accept failed: " << why;
  } else {
    BATON_LOG(DEBUG, "metrics") << "accept failed again: " << why;
  }
  std::weak_ptr<bool> alive = alive_;
  accept_retry_.expires_after(kAcceptRetry);
  accept_retry_.async_wait([this, alive](beast::error_code wait_ec) {
    if (!wait_ec && !alive.expired() && acceptor_.is_open()) Accept();
  });
}

void MetricsServer::OnAccepted(tcp::socket socket) {
  if (failed_accepts_ > 0) {
    BATON_LOG(INFO, "metrics") << "accepting again after " << failed_accepts_ << " failed accepts";
    failed_accepts_ = 0;
  }
  if (*sessions_ >= kMaxSessions) {
    if (refused_++ == 0) {
      BATON_LOG(WARN, "metrics") << kMaxSessions << " /metrics connections are open: "
                                 << "closing new ones at once until one ends";
    }
    beast::error_code ignored;
    socket.close(ignored);
    return;
  }
  if (refused_ > 0) {
    BATON_LOG(INFO, "metrics") << "serving again after closing " << refused_ << " connections over "
                               << kMaxSessions;
    refused_ = 0;
  }
  std::make_shared<Session>(std::move(socket), render_, sessions_)->Run();
}

}  // namespace baton
