#include "proto/http/http_server.h"

#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <future>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "tests/proto/http/http_test_client.h"

namespace baton {
namespace {

class HttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HttpServerOptions options;
    options.body_limit = 1024;
    options.on_response = [this](int status) {
      std::lock_guard lock(mu_);
      ++responses_[status];
    };
    server_ = std::make_unique<HttpServer>(io_, options);
    server_->Route(http::verb::get, "/hello", [](std::shared_ptr<HttpExchange> ex) {
      ex->Respond(200, "text/plain", "hello " + std::string(ex->path()));
    });
    server_->Route(http::verb::post, "/echo", [](std::shared_ptr<HttpExchange> ex) {
      ex->Respond(200, "text/plain", ex->request().body());
    });
    server_->Route(http::verb::get, "/later", [](std::shared_ptr<HttpExchange> ex) {
      std::thread([ex] { ex->RespondJson(202, R"({"from":"thread"})"); }).detach();
    });
    server_->Route(http::verb::get, "/dropped", [](std::shared_ptr<HttpExchange>) {});
    server_->Route(http::verb::get, "/held", [this](std::shared_ptr<HttpExchange> ex) {
      ex->OnAbort([this] { aborted_.set_value(); });
      held_.set_value(ex);  // answered by the test, or never
    });
    server_->Route(http::verb::get, "/stream", [this](std::shared_ptr<HttpExchange> ex) {
      ex->OnAbort([this] { aborted_.set_value(); });
      ex->BeginStream(200, "text/event-stream");
      ex->Write("one");
      streams_.set_value(ex);
    });
    ASSERT_TRUE(server_->Listen().ok());
    thread_ = std::thread([this] { io_.run(); });
  }

  void TearDown() override {
    io_.stop();
    thread_.join();
  }

  int Responses(int status) {
    std::lock_guard lock(mu_);
    return responses_[status];
  }

  boost::asio::io_context io_;
  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
  std::mutex mu_;
  std::map<int, int> responses_;
  std::promise<std::shared_ptr<HttpExchange>> streams_;
  std::promise<void> aborted_;
  std::promise<std::shared_ptr<HttpExchange>> held_;
};

TEST_F(HttpServerTest, KeepAliveServesSeveralRequestsOnOneConnection) {
  TestHttpClient client(server_->port());
  HttpReply a = client.Get("/hello?x=1");
  EXPECT_EQ(a.status, 200);
  EXPECT_EQ(a.body, "hello /hello");
  HttpReply b = client.Post("/echo", "ping");
  EXPECT_EQ(b.status, 200);
  EXPECT_EQ(b.body, "ping");
  EXPECT_EQ(Responses(200), 2);
}

TEST_F(HttpServerTest, UnknownPathIs404AndWrongMethodIs405) {
  TestHttpClient client(server_->port());
  HttpReply missing = client.Get("/nope");
  EXPECT_EQ(missing.status, 404);
  EXPECT_EQ(missing.content_type, "application/json");
  auto j = nlohmann::json::parse(missing.body);
  EXPECT_NE(j["error"]["message"].get<std::string>().find("/nope"), std::string::npos);
  EXPECT_TRUE(j["error"]["param"].is_null());
  HttpReply wrong = client.Post("/hello", "{}");
  EXPECT_EQ(wrong.status, 405);
  EXPECT_EQ(wrong.allow, "GET");
  EXPECT_EQ(client.Get("/hello").status, 200);  // the connection is still usable
  // A long path is named, cut short: the 404 does not echo kilobytes back.
  HttpReply long_path = client.Get("/" + std::string(10000, 'a'));
  EXPECT_EQ(long_path.status, 404);
  const std::string message =
      nlohmann::json::parse(long_path.body)["error"]["message"].get<std::string>();
  EXPECT_EQ(message, "no route for /" + std::string(199, 'a') + "...");
}

TEST_F(HttpServerTest, OversizedBodyIs413AndServerStaysUp) {
  {
    TestHttpClient client(server_->port());
    HttpReply reply = client.Post("/echo", std::string(4096, 'x'));
    EXPECT_EQ(reply.status, 413);
    EXPECT_TRUE(nlohmann::json::parse(reply.body).contains("error"));
  }
  TestHttpClient again(server_->port());
  EXPECT_EQ(again.Post("/echo", std::string(1024, 'y')).body, std::string(1024, 'y'));
  EXPECT_EQ(Responses(413), 1);
}

// Beast bounds neither a chunk-size line nor the trailers: a client that never ends one must
// get 413 once the read buffer is full, not grow the server until the request times out.
TEST_F(HttpServerTest, AnEndlessChunkLineIs413) {
  TestHttpClient client(server_->port());
  ASSERT_TRUE(
      client.SendRaw("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1;"));
  const std::string line(1 << 20, 'a');
  client.SendRaw(line);  // the server may close before all of it is taken
  std::string reply = client.ReadRawUntil("}}");
  EXPECT_EQ(reply.rfind("HTTP/1.1 413", 0), 0u) << reply.substr(0, 300);
  EXPECT_NE(reply.find("chunk line"), std::string::npos) << reply.substr(0, 300);
  TestHttpClient again(server_->port());
  EXPECT_EQ(again.Get("/hello").status, 200);
}

TEST_F(HttpServerTest, MalformedRequestIs400) {
  TestHttpClient client(server_->port());
  ASSERT_TRUE(client.SendRaw("NOT A REQUEST\r\n\r\n"));
  std::string reply = client.ReadRawUntil("}}");
  EXPECT_EQ(reply.rfind("HTTP/1.1 400", 0), 0u) << reply;
  TestHttpClient again(server_->port());
  EXPECT_EQ(again.Get("/hello").status, 200);
}

// A transfer coding that is not a final `chunked` leaves the body's length unknown: 400 and
// the connection closed, so that the body's bytes are never read as a second request.
TEST_F(HttpServerTest, ATransferCodingOtherThanChunkedIs400AndNothingRidesInItsBody) {
  for (const char* coding : {"gzip", "identity", "chunked, gzip"}) {
    TestHttpClient client(server_->port());
    ASSERT_TRUE(client.SendRaw(
        std::string("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: ") + coding +
        "\r\n\r\nGET /hello HTTP/1.1\r\nHost: x\r\nConnection: "
        "close\r\n\r\n"));
    const std::string all = client.ReadRawUntil(std::string(1, '\0'));  // until closed
    EXPECT_EQ(all.rfind("HTTP/1.1 400", 0), 0u) << coding << ": " << all;
    EXPECT_NE(all.find("Transfer-Encoding"), std::string::npos) << coding << ": " << all;
    EXPECT_EQ(all.find("hello /hello"), std::string::npos) << coding << ": smuggled: " << all;
  }
  TestHttpClient again(server_->port());
  EXPECT_EQ(again.Get("/hello").status, 200);
}

TEST_F(HttpServerTest, AnswersFromAnotherThread) {
  TestHttpClient client(server_->port());
  HttpReply reply = client.Get("/later");
  EXPECT_EQ(reply.status, 202);
  EXPECT_EQ(reply.body, R"({"from":"thread"})");
}

TEST_F(HttpServerTest, ExchangeDroppedUnansweredGets500) {
  TestHttpClient client(server_->port());
  EXPECT_EQ(client.Get("/dropped").status, 500);
  EXPECT_EQ(client.Get("/hello").status, 200);
}

TEST_F(HttpServerTest, ExpectContinueGetsInterimResponse) {
  TestHttpClient client(server_->port());
  ASSERT_TRUE(client.SendRaw(
      "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"));
  EXPECT_EQ(client.ReadRawUntil("\r\n\r\n"), "HTTP/1.1 100 Continue\r\n\r\n");
  ASSERT_TRUE(client.SendRaw("hello"));
  EXPECT_NE(client.ReadRawUntil("hello").find("200 OK"), std::string::npos);
}

// An HTTP/1.0 client's Expect is ignored (RFC 9110 10.1.1): its first response is the answer.
TEST_F(HttpServerTest, AnHttp10ClientsExpectationIsIgnored) {
  TestHttpClient client(server_->port());
  ASSERT_TRUE(client.SendRaw(
      "POST /echo HTTP/1.0\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"
      "hello"));
  const std::string reply = client.ReadRawUntil("hello");
  EXPECT_EQ(reply.rfind("HTTP/1.1 200 OK", 0), 0u) << reply;
  EXPECT_EQ(reply.find("100 Continue"), std::string::npos) << reply;
}

TEST_F(HttpServerTest, StreamChunksArriveBeforeTheEnd) {
  TestHttpClient client(server_->port());
  ASSERT_TRUE(client.Send(http::verb::get, "/stream", ""));
  ASSERT_EQ(client.ReadHeader(), 200);
  while (client.body() != "one") ASSERT_TRUE(client.ReadMore());
  // "one" came through while the stream is still open: now finish it.
  std::shared_ptr<HttpExchange> ex = streams_.get_future().get();
  ex->Write("two");
  ex->EndStream();
  while (!client.done()) ASSERT_TRUE(client.ReadMore());
  EXPECT_EQ(client.body(), "onetwo");
  EXPECT_FALSE(ex->aborted());
  EXPECT_EQ(client.Get("/hello").status, 200);  // keep-alive after a chunked response
}

// HTTP/1.0 has no chunked encoding (RFC 9112 6.1): a stream to a 1.0 client is sent as it
// is and ends when the connection closes.
TEST_F(HttpServerTest, AStreamToAnHttp10ClientIsUnchunkedAndEndsWithTheClose) {
  TestHttpClient client(server_->port());
  ASSERT_TRUE(client.SendRaw("GET /stream HTTP/1.0\r\nHost: x\r\n\r\n"));
  std::shared_ptr<HttpExchange> ex = streams_.get_future().get();
  ex->Write("two");
  ex->EndStream();
  const std::string all = client.ReadRawUntil(std::string(1, '\0'));  // until closed
  const size_t head_end = all.find("\r\n\r\n");
  ASSERT_NE(head_end, std::string::npos) << all;
  const std::string head = all.substr(0, head_end);
  EXPECT_EQ(head.find("Transfer-Encoding"), std::string::npos) << head;
  EXPECT_NE(head.find("Connection: close"), std::string::npos) << head;
  EXPECT_EQ(all.substr(head_end + 4), "onetwo");
}

TEST_F(HttpServerTest, ClientGoingAwayAbortsTheStream) {
  TestHttpClient client(server_->port());
  ASSERT_TRUE(client.Send(http::verb::get, "/stream", ""));
  ASSERT_EQ(client.ReadHeader(), 200);
  client.Close();
  std::shared_ptr<HttpExchange> ex = streams_.get_future().get();
  std::future<void> aborted = aborted_.get_future();
  // Writes into the closed connection fail sooner or later; the abort follows.
  for (int i = 0; i < 600; ++i) {
    ex->Write(std::string(4096, 'z'));
    if (aborted.wait_for(std::chrono::milliseconds(50)) == std::future_status::ready) break;
  }
  ASSERT_EQ(aborted.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  EXPECT_TRUE(ex->aborted());
  bool late = false;
  ex->OnAbort([&] { late = true; });  // registered after the abort: runs at once
  EXPECT_TRUE(late);
}

// A client that leaves while its (not streamed) request is handled aborts it at once: the
// engine stops generating instead of finishing work nobody will read.
TEST_F(HttpServerTest, ClientLeavingDuringAPlainRequestAbortsIt) {
  TestHttpClient client(server_->port());
  ASSERT_TRUE(client.Send(http::verb::get, "/held", ""));
  std::shared_ptr<HttpExchange> ex = held_.get_future().get();
  client.Close();
  ASSERT_EQ(aborted_.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_TRUE(ex->aborted());
}

// Pipelined requests read ahead by the watch are answered in order.
TEST_F(HttpServerTest, PipelinedRequestsAreAnsweredInOrder) {
  TestHttpClient client(server_->port());
  ASSERT_TRUE(
      client.SendRaw("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"
                     "GET /later HTTP/1.1\r\nHost: x\r\n\r\n"
                     "GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  const std::string all = client.ReadRawUntil(std::string(1, '\0'));  // until closed
  const size_t first = all.find("hello /hello");
  const size_t second = all.find(R"({"from":"thread"})");
  ASSERT_NE(first, std::string::npos) << all;
  ASSERT_NE(second, std::string::npos) << all;
  EXPECT_LT(first, second);
  EXPECT_NE(all.find("hello /hello", second), std::string::npos) << all;
}

// A burst of pipelined requests far larger than the read-ahead (thousands in one write) is
// answered whole and in order: the read-ahead stops at its bound instead of overflowing the
// read buffer (which threw out of the handler and ended the process).
TEST_F(HttpServerTest, AHugePipelinedBurstIsAnsweredWhole) {
  constexpr int kRequests = 6000;
  std::string burst;
  for (int i = 0; i < kRequests - 1; ++i) burst += "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n";
  burst += "GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  TestHttpClient client(server_->port());
  std::thread writer([&] { EXPECT_TRUE(client.SendRaw(burst)); });
  const std::string all = client.ReadRawUntil(std::string(1, '\0'));  // until closed
  writer.join();
  int answered = 0;
  for (size_t at = all.find("hello /hello"); at != std::string::npos;
       at = all.find("hello /hello", at + 1)) {
    ++answered;
  }
  EXPECT_EQ(answered, kRequests);
  EXPECT_EQ(all.find("HTTP/1.1 4"), std::string::npos) << all.substr(all.find("HTTP/1.1 4"), 300);
  EXPECT_EQ(Responses(200), kRequests);
}

// A new connection that sends nothing is closed after the request timeout, not held for the
// (longer) keep-alive idle time: silent connections cannot hold the server's slots long.
TEST(HttpServerTimeoutTest, ASilentNewConnectionGetsTheRequestTimeout) {
  boost::asio::io_context io;
  HttpServerOptions options;
  options.request_timeout = std::chrono::milliseconds(200);
  options.idle_timeout = std::chrono::milliseconds(600000);
  HttpServer server(io, options);
  ASSERT_TRUE(server.Listen().ok());
  std::thread thread([&io] { io.run(); });
  TestHttpClient client(server.port());
  std::promise<std::string> read;
  std::thread reader([&] { read.set_value(client.ReadRawUntil(std::string(1, '\0'))); });
  std::future<std::string> closed = read.get_future();
  const bool in_time = closed.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  if (!in_time) client.Close();  // ends the reader
  reader.join();
  io.stop();
  thread.join();
  EXPECT_TRUE(in_time) << "the silent connection was held past 30 s";
}

TEST(HttpServerListenTest, RefusesAnUnresolvableHost) {
  boost::asio::io_context io;
  HttpServerOptions options;
  options.host = "no such host name.invalid";
  HttpServer server(io, options);
  Status s = server.Listen();
  EXPECT_FALSE(s.ok());
}

}  // namespace
}  // namespace baton
