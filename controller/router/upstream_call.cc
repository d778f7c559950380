#include "controller/router/upstream_call.h"

#include <boost/asio/ip/address.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <limits>

#include "base/log.h"
#include "controller/router/router_options.h"

namespace baton {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

class UpstreamCall : public std::enable_shared_from_this<UpstreamCall> {
 public:
  UpstreamCall(asio::io_context& io, std::shared_ptr<HttpExchange> exchange,
               UpstreamTimeouts timeouts, UpstreamDone done)
      : stream_(asio::make_strand(io)),
        exchange_(std::move(exchange)),
        timeouts_(timeouts),
        done_(std::move(done)) {}

  void Start(const std::string& address) {
    std::string host;
    uint16_t port = 0;
    boost::system::error_code ec;
    asio::ip::address ip;
    if (SplitHostPort(address, "backend", &host, &port).ok()) {
      ip = asio::ip::make_address(host, ec);
    } else {
      ec = asio::error::invalid_argument;
    }
    if (ec) return Fail(502, "bad_address", "the backend address is not HOST:PORT: " + address);
    auto self = shared_from_this();
    std::weak_ptr<UpstreamCall> weak = self;
    exchange_->OnAbort([weak] {
      if (auto call = weak.lock()) {
        asio::post(call->stream_.get_executor(), [call] {
          call->client_gone_ = true;
          beast::error_code ignored;
          call->stream_.socket().close(ignored);
        });
      }
    });
    asio::post(stream_.get_executor(), [self, endpoint = tcp::endpoint(ip, port)] {
      self->stream_.expires_after(self->timeouts_.connect);
      self->stream_.async_connect(endpoint, [self](beast::error_code ec) { self->OnConnect(ec); });
    });
  }

 private:
  void OnConnect(beast::error_code ec) {
    if (ec) return Fail(502, "connect", "cannot connect to the engine: " + ec.message());
    const HttpRequest& in = exchange_->request();
    request_.method(in.method());
    request_.target(in.target());
    request_.version(11);
    request_.keep_alive(false);
    request_.set(http::field::host, "baton-engine");
    if (auto ct = in.find(http::field::content_type); ct != in.end()) {
      request_.set(http::field::content_type, ct->value());
    }
    if (auto accept = in.find(http::field::accept); accept != in.end()) {
      request_.set(http::field::accept, accept->value());
    }
    request_.body() = in.body();
    request_.prepare_payload();
    stream_.expires_after(timeouts_.first_byte);
    http::async_write(stream_, request_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->Fail(502, "write", "engine write failed: " + ec.message());
      self->ReadHeader();
    });
  }

  void ReadHeader() {
    parser_.body_limit(std::numeric_limits<std::uint64_t>::max());
    http::async_read_header(
        stream_, buffer_, parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
  }

  void OnHeader(beast::error_code ec) {
    if (ec == beast::error::timeout) {
      return Fail(504, "first_byte_timeout", "the engine did not answer in time");
    }
    if (ec) return Fail(502, "read_header", "the engine's response broke: " + ec.message());
    const auto& head = parser_.get();
    status_ = head.result_int();
    content_type_ = std::string(head[http::field::content_type]);
    streaming_ = parser_.chunked() || content_type_.rfind("text/event-stream", 0) == 0;
    if (streaming_) exchange_->BeginStream(status_, content_type_);
    ReadBody();
  }

  void ReadBody() {
    if (parser_.is_done()) return Finish();
    parser_.get().body().data = chunk_;
    parser_.get().body().size = sizeof(chunk_);
    stream_.expires_after(timeouts_.idle);
    http::async_read_some(
        stream_, buffer_, parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnBody(ec); });
  }

  void OnBody(beast::error_code ec) {
    if (ec == http::error::need_buffer) ec = {};
    const size_t n = sizeof(chunk_) - parser_.get().body().size;
    if (n > 0) {
      if (streaming_) {
        exchange_->Write(std::string(chunk_, n));
      } else {
        body_.append(chunk_, n);
      }
    }
    if (ec) {
      if (!streaming_)
        return Fail(502, "read_body", "the engine's response broke: " + ec.message());
      BATON_LOG(WARN, "router") << "engine stream broke: " << ec.message();
      exchange_->EndStream();
      return Done(status_, client_gone_ ? "client_gone" : "stream_broken");
    }
    ReadBody();
  }

  void Finish() {
    if (streaming_) {
      exchange_->EndStream();
    } else {
      exchange_->Respond(status_, content_type_.empty() ? "application/json" : content_type_,
                         std::move(body_));
    }
    Done(status_, "");
  }

  void Fail(int status, const std::string& kind, const std::string& message) {
    if (!client_gone_) {
      BATON_LOG(WARN, "router") << exchange_->request().target() << ": " << message;
    }
    exchange_->RespondError(status, message);
    Done(status, kind);
  }

  void Done(int status, const std::string& kind) {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    if (done_) std::exchange(done_, nullptr)(status, kind);
  }

  beast::tcp_stream stream_;
  std::shared_ptr<HttpExchange> exchange_;
  UpstreamTimeouts timeouts_;
  UpstreamDone done_;
  http::request<http::string_body> request_;
  http::response_parser<http::buffer_body> parser_;
  beast::flat_buffer buffer_;
  char chunk_[16384];
  std::string body_;
  std::string content_type_;
  int status_ = 0;
  bool streaming_ = false;
  bool client_gone_ = false;
};

}  // namespace

void StartUpstreamCall(asio::io_context& io, const std::string& address,
                       std::shared_ptr<HttpExchange> exchange, UpstreamTimeouts timeouts,
                       UpstreamDone done) {
  std::make_shared<UpstreamCall>(io, std::move(exchange), timeouts, std::move(done))
      ->Start(address);
}

}  // namespace baton
