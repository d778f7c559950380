#include "controller/metrics_server.h"

#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "base/log.h"

namespace baton {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
using tcp = boost::asio::ip::tcp;

// One connection: read a request, write the answer, close.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, MetricsServer::Render render)
      : stream_(std::move(socket)), render_(std::move(render)) {}

  void Run() {
    parser_.body_limit(8192);
    parser_.header_limit(8192);
    stream_.expires_after(std::chrono::seconds(5));
    http::async_read(stream_, buffer_, parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       if (!ec) self->Answer();
                     });
  }

 private:
  void Answer() {
    const auto& req = parser_.get();
    response_.version(req.version());
    response_.keep_alive(false);
    response_.set(http::field::content_type, "text/plain; version=0.0.4");
    if (req.method() != http::verb::get) {
      response_.result(http::status::method_not_allowed);
      response_.body() = "only GET\n";
    } else if (req.target() != "/metrics") {
      response_.result(http::status::not_found);
      response_.body() = "try /metrics\n";
    } else {
      response_.result(http::status::ok);
      response_.body() = render_();
    }
    response_.prepare_payload();
    http::async_write(stream_, response_, [self = shared_from_this()](beast::error_code, size_t) {
      beast::error_code ignored;
      self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    });
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  http::request_parser<http::string_body> parser_;
  http::response<http::string_body> response_;
  MetricsServer::Render render_;
};

}  // namespace

MetricsServer::MetricsServer(boost::asio::io_context& io, Render render)
    : acceptor_(io), render_(std::move(render)) {}

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
    if (alive.expired()) return;
    if (!ec) std::make_shared<Session>(std::move(socket), render_)->Run();
    if (acceptor_.is_open()) Accept();
  });
}

}  // namespace baton
