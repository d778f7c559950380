#include "proto/http/http_connection.h"

#include <array>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <deque>
#include <optional>
#include <sstream>

#include "base/log.h"

namespace baton {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;

namespace {

// Bytes of pipelined requests read ahead while one is handled; past this the watch for a
// departing client stops until the next request.
constexpr size_t kMaxPipelinedBytes = 64 * 1024;
// Beyond the header limit, what the read buffer may hold of bytes not yet parsed: pipelined
// requests and one read. Bodies leave the buffer as they are parsed, but a chunk-size line,
// its extensions and the trailers stay in it until their CRLF, and Beast bounds none of
// them: without this cap one client sending an endless chunk line grows it without end.
constexpr size_t kReadSlackBytes = kMaxPipelinedBytes + 64 * 1024;

std::string ChunkFrame(std::string_view data) {
  char size[24];
  std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
  std::string out = size;
  out.append(data);
  out += "\r\n";
  return out;
}

template <class Message>
std::string Serialize(const Message& message) {
  std::ostringstream os;
  os << message;
  return os.str();
}

}  // namespace

// One accepted socket. Runs on its strand; reads a request, hands it to its handler as an
// HttpExchange, writes the answer, and reads the next one while keep-alive holds.
class HttpConnection : public std::enable_shared_from_this<HttpConnection> {
 public:
  HttpConnection(tcp::socket socket, std::shared_ptr<const HttpRoutes> routes)
      : stream_(std::move(socket)),
        routes_(std::move(routes)),
        buffer_(routes_->options.header_limit + kReadSlackBytes) {
    ++routes_->connections;
  }
  ~HttpConnection() {
    {
      MutexLock lock(routes_->live_mu);
      routes_->live.erase(this);
    }
    --routes_->connections;
  }

  void Start() {
    {
      MutexLock lock(routes_->live_mu);
      routes_->live.emplace(this, weak_from_this());
    }
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->ReadHeader(); });
  }

  // Closes the connection if it waits for a request of which nothing has arrived.
  void CloseIfIdle() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] {
      if (self->phase_ != Phase::kReading || self->request_started_ || self->buffer_.size() > 0) {
        return;
      }
      self->Close();
    });
  }

  // Answers 503 at once and closes: the server is at its connection limit.
  void Refuse() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] {
      self->keep_alive_ = false;
      self->SendError(503, "too many connections (limit " +
                               std::to_string(self->routes_->options.max_connections) + ")");
    });
  }

  template <class Fn>
  void Post(Fn fn) {
    net::post(stream_.get_executor(), std::move(fn));
  }

  void DoRespond(uint64_t seq, int status, std::string type, std::string body,
                 HttpHeaders headers) {
    if (seq != seq_ || phase_ != Phase::kHandling) return;
    http::response<http::string_body> res{static_cast<http::status>(status), 11};
    res.set(http::field::content_type, type);
    for (auto& [name, value] : headers) res.set(name, value);
    if (routes_->closing.load()) keep_alive_ = false;
    res.keep_alive(keep_alive_);
    res.body() = std::move(body);
    res.prepare_payload();
    routes_->Count(status);
    phase_ = Phase::kFinishing;
    Enqueue(Serialize(res), true);
  }

  // An error the server makes itself for exchange `seq` (counted by on_server_response).
  void RespondOwnError(uint64_t seq, int status, const std::string& message) {
    if (seq != seq_ || phase_ != Phase::kHandling) return;
    routes_->CountOwn(status);
    DoRespond(seq, status, "application/json", HttpErrorJson(status, message), {});
  }

  void DoBegin(uint64_t seq, int status, std::string type, HttpHeaders headers) {
    if (seq != seq_ || phase_ != Phase::kHandling) return;
    http::response<http::empty_body> res{static_cast<http::status>(status), 11};
    res.set(http::field::content_type, type);
    res.set(http::field::cache_control, "no-cache");
    for (auto& [name, value] : headers) res.set(name, value);
    if (http10_) {
      keep_alive_ = false;  // HTTP/1.0 has no chunked encoding: the stream ends with the close
    } else {
      res.chunked(true);
    }
    if (routes_->closing.load()) keep_alive_ = false;
    res.keep_alive(keep_alive_);
    routes_->Count(status);
    phase_ = Phase::kStreaming;
    Enqueue(Serialize(res.base()), false);
  }

  void DoWrite(uint64_t seq, std::string chunk) {
    if (seq != seq_ || phase_ != Phase::kStreaming || chunk.empty()) return;
    Enqueue(http10_ ? std::move(chunk) : ChunkFrame(chunk), false);
  }

  void DoEnd(uint64_t seq) {
    if (seq != seq_ || phase_ != Phase::kStreaming) return;
    phase_ = Phase::kFinishing;
    Enqueue(http10_ ? std::string() : std::string("0\r\n\r\n"), true);
  }

 private:
  enum class Phase { kReading, kHandling, kStreaming, kFinishing, kClosed };

  // Waits (up to the idle timeout) for the first byte of the next request, then gives the
  // whole request the request timeout.
  void ReadHeader() {
    phase_ = Phase::kReading;
    parser_.emplace();
    parser_->body_limit(routes_->options.body_limit);
    parser_->header_limit(routes_->options.header_limit);
    if (buffer_.size() > 0) return ReadRequest();
    // A new connection's first request gets the request timeout from the accept: one that
    // never sends a byte must not hold a connection slot for the keep-alive idle time.
    stream_.expires_after(
        seq_ == 0 ? std::min(routes_->options.idle_timeout, routes_->options.request_timeout)
                  : routes_->options.idle_timeout);
    stream_.async_read_some(buffer_.prepare(4096),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              if (ec) return self->OnReadError(ec);
                              self->buffer_.commit(n);
                              self->ReadRequest();
                            });
  }

  // The request timer cancels the read instead of closing the socket (as the stream's own
  // timeout would), so that the 408 can still be written.
  void ReadRequest() {
    request_started_ = true;
    stream_.expires_never();
    request_timer_.expires_after(routes_->options.request_timeout);
    request_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec || !self->request_started_) return;
      self->request_timed_out_ = true;
      beast::error_code ignored;
      self->stream_.socket().cancel(ignored);
    });
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
  }

  void OnHeader(beast::error_code ec) {
    if (ec) return OnReadError(ec);
    // A transfer coding other than a final `chunked` leaves the body's length unknown: Beast
    // would read none and take the body's bytes as the next request (request smuggling behind
    // a proxy that honours the coding). RFC 9112 section 6.1: 400, and the connection closed.
    if (parser_->get().count(http::field::transfer_encoding) != 0 && !parser_->chunked()) {
      request_started_ = false;
      request_timer_.cancel();
      keep_alive_ = false;
      return SendError(400, "unsupported Transfer-Encoding: only chunked is accepted");
    }
    // An HTTP/1.0 client's expectation is ignored (RFC 9110 section 10.1.1): it would read the
    // 100 as its response.
    auto expect = parser_->get().find(http::field::expect);
    if (expect != parser_->get().end() && parser_->get().version() >= 11 &&
        beast::iequals(expect->value(), "100-continue")) {
      auto cont = std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
      net::async_write(stream_, net::buffer(*cont),
                       [self = shared_from_this(), cont](beast::error_code wec, size_t) {
                         if (wec) return self->Close();
                         self->ReadBody();
                       });
      return;
    }
    ReadBody();
  }

  void ReadBody() {
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       if (ec) return self->OnReadError(ec);
                       self->Dispatch();
                     });
  }

  void OnReadError(beast::error_code ec) {
    request_started_ = false;
    request_timer_.cancel();
    if (std::exchange(request_timed_out_, false)) {
      keep_alive_ = false;
      BATON_LOG(DEBUG, "http") << "request timed out while arriving";
      return SendError(408, "the request did not arrive within " +
                                std::to_string(routes_->options.request_timeout.count()) + " ms");
    }
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == beast::error::timeout ||
        ec == net::error::operation_aborted || ec == net::error::connection_reset) {
      return Close();
    }
    keep_alive_ = false;
    if (ec == http::error::body_limit) {
      return SendError(413, "the request body exceeds the limit of " +
                                std::to_string(routes_->options.body_limit) + " bytes");
    }
    if (ec == http::error::header_limit) {
      return SendError(431, "the request header exceeds the limit of " +
                                std::to_string(routes_->options.header_limit) + " bytes");
    }
    if (ec == http::error::buffer_overflow) {
      return SendError(413, "a chunk line or the trailers of the request exceed " +
                                std::to_string(buffer_.max_size()) + " bytes");
    }
    BATON_LOG(DEBUG, "http") << "bad request: " << ec.message();
    SendError(400, "malformed HTTP request: " + ec.message());
  }

  void SendError(int status, const std::string& message) {
    routes_->CountOwn(status);
    ++seq_;
    phase_ = Phase::kHandling;
    DoRespond(seq_, status, "application/json", HttpErrorJson(status, message), {});
  }

  void Dispatch();

  void Enqueue(std::string bytes, bool ends_exchange) {
    writes_.emplace_back(std::move(bytes), ends_exchange);
    if (!writing_) WriteNext();
  }

  void WriteNext() {
    if (writes_.empty() || phase_ == Phase::kClosed) return;
    writing_ = true;
    stream_.expires_after(routes_->options.write_timeout);
    net::async_write(
        stream_, net::buffer(writes_.front().first),
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnWritten(ec); });
  }

  void OnWritten(beast::error_code ec) {
    writing_ = false;
    if (ec || writes_.empty()) {
      BATON_LOG(DEBUG, "http") << "write failed: " << ec.message();
      return Close();
    }
    const bool ends = writes_.front().second;
    writes_.pop_front();
    if (!ends) return WriteNext();
    exchange_.reset();
    if (watching_) {  // one read at a time: the next one starts when the watch has ended
      resume_after_watch_ = true;
      beast::error_code ignored;
      stream_.socket().cancel(ignored);
      return;
    }
    Resume();
  }

  // After a response: the next request, unless the connection ends (no keep-alive, or the
  // server drains: EndKeepAlive came after this response's header was sent).
  void Resume() {
    if (keep_alive_ && !routes_->closing.load()) return ReadHeader();
    LingerThenClose();
  }

  // While a request is handled nothing else reads the socket, so a client that leaves would
  // go unnoticed until a write failed: for a response that is not streamed, after the whole
  // generation. The watch reads on; end of stream or an error aborts the exchange. Bytes of
  // a pipelined next request are kept for it.
  void Watch() {
    // Past the read-ahead bound the watch waits for the next request: each request handled
    // would otherwise read more than it takes out, until the read buffer overflows.
    if (buffer_.size() >= kMaxPipelinedBytes) return;
    watching_ = true;
    stream_.socket().async_read_some(
        net::buffer(watch_buf_),
        [self = shared_from_this()](beast::error_code ec, size_t n) { self->OnWatch(ec, n); });
  }

  void OnWatch(beast::error_code ec, size_t n) {
    watching_ = false;
    if (n > 0) {
      net::buffer_copy(buffer_.prepare(n), net::buffer(watch_buf_.data(), n));
      buffer_.commit(n);
    }
    if (phase_ == Phase::kClosed) return;
    if (std::exchange(resume_after_watch_, false)) return Resume();
    if (ec == net::error::operation_aborted) return;
    if (ec) {
      // Once answered, the reply's own write (or the next read) sees the end.
      if (phase_ != Phase::kHandling && phase_ != Phase::kStreaming) return;
      BATON_LOG(DEBUG, "http") << "client left during its request: " << ec.message();
      return Close();
    }
    Watch();
  }

  // After a reply that ends the connection (413, 431, 400, Connection: close) the client may
  // still be sending; closing with unread input makes the kernel reset the connection and
  // destroy the reply in flight. So half-close, discard what still arrives for a short while,
  // then close.
  void LingerThenClose() {
    if (phase_ == Phase::kClosed) return;
    phase_ = Phase::kFinishing;
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    linger_buf_.resize(64 * 1024);
    stream_.expires_after(std::chrono::seconds(1));
    DrainSome();
  }

  void DrainSome() {
    stream_.async_read_some(net::buffer(linger_buf_),
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              if (ec) return self->Close();
                              self->DrainSome();
                            });
  }

  void Close() {
    if (phase_ == Phase::kClosed) return;
    const bool in_exchange = phase_ == Phase::kHandling || phase_ == Phase::kStreaming;
    phase_ = Phase::kClosed;
    request_timer_.cancel();
    writes_.clear();
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
    linger_buf_ = {};
    if (!in_exchange) return;
    if (auto ex = exchange_.lock()) ex->NotifyAbort();
  }

  beast::tcp_stream stream_;
  std::shared_ptr<const HttpRoutes> routes_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::weak_ptr<HttpExchange> exchange_;
  uint64_t seq_ = 0;
  Phase phase_ = Phase::kReading;
  bool keep_alive_ = false;
  bool http10_ = false;  // the request is HTTP/1.0: a stream is sent unchunked, then closed
  bool request_started_ = false;  // the current request's first byte has arrived
  bool request_timed_out_ = false;
  net::steady_timer request_timer_{stream_.get_executor()};
  bool writing_ = false;
  std::deque<std::pair<std::string, bool>> writes_;
  std::vector<char> linger_buf_;  // discarded input while lingering before close
  bool watching_ = false;         // a Watch() read is pending
  bool resume_after_watch_ = false;
  std::array<char, 4096> watch_buf_{};
};

void HttpConnection::Dispatch() {
  stream_.expires_never();
  request_started_ = false;
  request_timer_.cancel();
  HttpRequest request = parser_->release();
  keep_alive_ = request.keep_alive();
  http10_ = request.version() < 11;
  ++seq_;
  phase_ = Phase::kHandling;
  std::shared_ptr<HttpExchange> ex(new HttpExchange(shared_from_this(), seq_, std::move(request)));
  exchange_ = ex;
  Watch();
  auto it = routes_->table.find(ex->path());
  if (it == routes_->table.end()) {
    routes_->CountOwn(404);
    // The path as the client sent it, cut short: a 404 is no echo service for 16 KB paths.
    constexpr size_t kPathShown = 200;
    const std::string_view path = ex->path();
    return ex->RespondError(404, "no route for " + std::string(path.substr(0, kPathShown)) +
                                     (path.size() > kPathShown ? "..." : ""));
  }
  std::string allow;
  for (const auto& [verb, handler] : it->second) {
    if (verb == ex->request().method()) {
      try {
        return handler(ex);
      } catch (const std::exception& e) {
        BATON_LOG(ERROR, "http") << "handler for " << it->first << " threw: " << e.what();
        routes_->CountOwn(500);
        return ex->RespondError(500, "internal error");
      }
    }
    allow += (allow.empty() ? "" : ", ") + std::string(http::to_string(verb));
  }
  routes_->CountOwn(405);
  ex->Respond(405, "application/json",
              HttpErrorJson(405, "method " + std::string(ex->request().method_string()) +
                                     " is not allowed on " + it->first),
              {{"Allow", allow}});
}

HttpExchange::HttpExchange(std::shared_ptr<HttpConnection> connection, uint64_t seq,
                           HttpRequest request)
    : connection_(std::move(connection)), seq_(seq), request_(std::move(request)) {}

HttpExchange::~HttpExchange() {
  if (answered_.load()) return;
  connection_->Post([c = connection_, seq = seq_] {
    c->RespondOwnError(seq, 500, "the request was dropped without an answer");
  });
}

void HttpExchange::Respond(int status, std::string content_type, std::string body,
                           HttpHeaders headers) {
  if (answered_.exchange(true)) return;
  connection_->Post([c = connection_, seq = seq_, status, t = std::move(content_type),
                     b = std::move(body), h = std::move(headers)]() mutable {
    c->DoRespond(seq, status, std::move(t), std::move(b), std::move(h));
  });
}

void HttpExchange::BeginStream(int status, std::string content_type, HttpHeaders headers) {
  if (answered_.exchange(true)) return;
  connection_->Post(
      [c = connection_, seq = seq_, status, t = std::move(content_type),
       h = std::move(headers)]() mutable { c->DoBegin(seq, status, std::move(t), std::move(h)); });
}

void HttpExchange::Write(std::string chunk) {
  connection_->Post([c = connection_, seq = seq_, d = std::move(chunk)]() mutable {
    c->DoWrite(seq, std::move(d));
  });
}

void HttpExchange::EndStream() {
  connection_->Post([c = connection_, seq = seq_] { c->DoEnd(seq); });
}

void CloseIdleConnections(const HttpRoutes& routes) {
  std::vector<std::shared_ptr<HttpConnection>> open;
  {
    MutexLock lock(routes.live_mu);
    for (const auto& [raw, weak] : routes.live) {
      if (auto c = weak.lock()) open.push_back(std::move(c));
    }
  }
  for (const auto& c : open) c->CloseIfIdle();
}

void ServeConnection(tcp::socket socket, std::shared_ptr<const HttpRoutes> routes) {
  auto connection = std::make_shared<HttpConnection>(std::move(socket), routes);
  const size_t limit = routes->options.max_connections;
  if (limit > 0 && routes->connections.load() > limit) {
    BATON_LOG(WARN, "http") << "connection refused: " << limit << " connections open";
    connection->Refuse();
  } else {
    connection->Start();
  }
}

}  // namespace baton
