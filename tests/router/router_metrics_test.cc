// The router's /metrics text (router/router_metrics.h) on gauges made by hand.
#include "router/router_metrics.h"

#include <gtest/gtest.h>

#include <string>

namespace baton {
namespace {

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(RouterMetricsText, LargeAndFractionalValuesAreWrittenExactly) {
  RouterMetrics m;
  m.ObserveQueueWait(1'234'567.25);
  RouterGauges g;
  g.table.version = 2'097'152;
  g.table.epoch = 12'345'678;
  const std::string text = m.Render(g);
  EXPECT_TRUE(Has(text, "\nbaton_router_route_table_version 2097152\n")) << text;
  EXPECT_TRUE(Has(text, "\nbaton_router_epoch 12345678\n")) << text;
  EXPECT_TRUE(Has(text, "\nbaton_router_queue_wait_seconds_sum 1234567.25\n")) << text;
}

// The series the shedding alert and rule read exist before the first 429 (and the 503 of a
// drained pair before the first): rate() cannot see the first increment of a series that
// appears with it.
TEST(RouterMetricsText, TheCompletionRoutesStartWithTheirOkAndShedSeries) {
  RouterMetrics m;
  const std::string text = m.Render(RouterGauges{});
  for (const char* route : {"/v1/completions", "/v1/chat/completions"}) {
    for (const char* status : {"200", "429", "503"}) {
      EXPECT_TRUE(Has(text, std::string("\nbaton_router_requests_total{route=\"") + route +
                                "\",status=\"" + status + "\"} 0\n"))
          << text;
    }
  }
  m.Record("/v1/completions", 429);
  EXPECT_TRUE(Has(m.Render(RouterGauges{}),
                  "\nbaton_router_requests_total{route=\"/v1/completions\",status=\"429\"} 1\n"));
}

}  // namespace
}  // namespace baton
