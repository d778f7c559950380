// TestHttpClient: a blocking HTTP/1.1 client on Boost.Beast for tests of HTTP servers. One
// connection (keep-alive), whole replies or a response body read piece by piece, and a
// helper that splits a server-sent-event body into its `data:` payloads.
#pragma once

#include <gtest/gtest.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <optional>
#include <string>
#include <vector>

namespace baton {

namespace http = boost::beast::http;

struct HttpReply {
  int status = -1;  // -1: no reply (the error says why)
  std::string body;
  std::string content_type;
  std::string allow;
  std::string retry_after;
  std::string www_authenticate;
  std::string error;
};

class TestHttpClient {
 public:
  explicit TestHttpClient(uint16_t port) : socket_(io_) {
    boost::system::error_code ec;
    socket_.connect({boost::asio::ip::make_address("127.0.0.1"), port}, ec);
    EXPECT_FALSE(ec) << "connect to port " << port << ": " << ec.message();
  }

  // Sent with every request from now on ("" sends none).
  void SetAuthorization(std::string value) { authorization_ = std::move(value); }

  HttpReply Get(const std::string& target) { return Call(http::verb::get, target, ""); }
  HttpReply Post(const std::string& target, const std::string& body) {
    return Call(http::verb::post, target, body);
  }

  HttpReply Call(http::verb method, const std::string& target, const std::string& body) {
    if (!Send(method, target, body)) return Failed();
    boost::system::error_code ec;
    http::response<http::string_body> res;
    http::read(socket_, buffer_, res, ec);
    if (ec) return Failed(ec.message());
    HttpReply reply;
    reply.status = res.result_int();
    reply.body = res.body();
    reply.content_type = std::string(res[http::field::content_type]);
    reply.allow = std::string(res[http::field::allow]);
    reply.retry_after = std::string(res[http::field::retry_after]);
    reply.www_authenticate = std::string(res[http::field::www_authenticate]);
    return reply;
  }

  // Writes raw bytes (for malformed requests).
  bool SendRaw(const std::string& bytes) {
    boost::system::error_code ec;
    boost::asio::write(socket_, boost::asio::buffer(bytes), ec);
    return !ec;
  }

  bool Send(http::verb method, const std::string& target, const std::string& body) {
    http::request<http::string_body> req{method, target, 11};
    req.set(http::field::host, "127.0.0.1");
    if (method == http::verb::post) req.set(http::field::content_type, "application/json");
    if (!authorization_.empty()) req.set(http::field::authorization, authorization_);
    req.body() = body;
    req.prepare_payload();
    boost::system::error_code ec;
    http::write(socket_, req, ec);
    return !ec;
  }

  // Reads raw bytes until `delim` has been seen (nothing else may be pending).
  std::string ReadRawUntil(const std::string& delim) {
    std::string out;
    char buf[256];
    while (out.find(delim) == std::string::npos) {
      boost::system::error_code ec;
      const size_t n = socket_.read_some(boost::asio::buffer(buf), ec);
      if (ec) break;
      out.append(buf, n);
    }
    return out;
  }

  // Streaming: after Send(), reads the header; then ReadMore() grows body() piece by piece.
  int ReadHeader() {
    parser_.emplace();
    parser_->body_limit(64u << 20);
    boost::system::error_code ec;
    http::read_header(socket_, buffer_, *parser_, ec);
    if (ec) return -1;
    return parser_->get().result_int();
  }
  // False at the end of the body or on an error.
  bool ReadMore() {
    if (parser_->is_done()) return false;
    boost::system::error_code ec;
    http::read_some(socket_, buffer_, *parser_, ec);
    return !ec || ec == http::error::need_buffer;
  }
  const std::string& body() const { return parser_->get().body(); }
  bool done() const { return parser_->is_done(); }
  // Reads until body() holds at least `events` complete server-sent events.
  bool ReadEvents(size_t events) {
    while (SplitEvents(body()).size() < events) {
      if (!ReadMore()) return SplitEvents(body()).size() >= events;
    }
    return true;
  }
  void Close() {
    boost::system::error_code ec;
    socket_.shutdown(boost::asio::ip::tcp::socket::shutdown_both, ec);
    socket_.close(ec);
  }

  // The payload of each complete `data: ...` event of an SSE body.
  static std::vector<std::string> SplitEvents(const std::string& body) {
    std::vector<std::string> events;
    size_t pos = 0;
    while (true) {
      const size_t end = body.find("\n\n", pos);
      if (end == std::string::npos) break;
      std::string event = body.substr(pos, end - pos);
      if (event.rfind("data: ", 0) == 0) events.push_back(event.substr(6));
      pos = end + 2;
    }
    return events;
  }

 private:
  HttpReply Failed(const std::string& error = "write failed") {
    HttpReply r;
    r.error = error;
    return r;
  }

  boost::asio::io_context io_;
  boost::asio::ip::tcp::socket socket_;
  boost::beast::flat_buffer buffer_;
  std::string authorization_;
  std::optional<boost::beast::http::response_parser<boost::beast::http::string_body>> parser_;
};

}  // namespace baton
