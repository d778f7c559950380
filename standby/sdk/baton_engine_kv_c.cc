// The C ABI's KV-warm failover calls (baton_engine.h, "KV-warm failover") over
// baton::EngineSession: the block headers and quarantined blocks the handle keeps from the
// promotion and grants (Remember), the wait for the quarantined blocks, and the reports.
#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "proto/wire/crc32c.h"
#include "standby/sdk/baton_engine_c_internal.h"

namespace baton_c {

void Remember(baton_engine* engine, const baton::SessionEvent& event) {
  using Kind = baton::SessionEventKind;
  if (event.kind == Kind::kDrain) engine->drain_successor.store(event.successor);
  if (event.kind != Kind::kPromoted && event.kind != Kind::kGranted) return;
  std::lock_guard lock(engine->kv_mu);
  engine->headers = event.inherited_headers;
  if (event.kind != Kind::kPromoted) return;
  engine->quarantined = event.quarantined;
  engine->quarantined_headers = event.quarantined_headers;
  engine->barrier_estimate_us =
      std::chrono::duration_cast<std::chrono::microseconds>(event.barrier_estimate).count();
  engine->wait_limit_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(event.wait_limit).count();
}

}  // namespace baton_c

using namespace baton_c;  // NOLINT(google-build-using-namespace): the library's own helpers

namespace {

size_t CopyBytes(const std::vector<uint8_t>& from, void* out, size_t capacity) {
  if (out != nullptr) std::memcpy(out, from.data(), std::min(capacity, from.size()));
  return from.size();
}

}  // namespace

extern "C" {

size_t baton_engine_event_headers(baton_engine* engine, void* out, size_t capacity) {
  if (engine == nullptr) return 0;
  std::lock_guard lock(engine->kv_mu);
  return CopyBytes(engine->headers, out, capacity);
}

size_t baton_engine_quarantined(baton_engine* engine, baton_extent* out, size_t capacity,
                                void* headers, size_t header_capacity, int64_t* barrier_estimate_us,
                                int64_t* wait_limit_ms) {
  if (engine == nullptr) return 0;
  std::lock_guard lock(engine->kv_mu);
  const size_t n = std::min(capacity, engine->quarantined.size());
  for (size_t i = 0; out != nullptr && i < n; ++i) {
    const baton::MappedExtent& e = engine->quarantined[i];
    out[i] = baton_extent{.first = e.first, .count = e.count, .data = e.data, .bytes = e.bytes};
  }
  CopyBytes(engine->quarantined_headers, headers, header_capacity);
  if (barrier_estimate_us != nullptr) *barrier_estimate_us = engine->barrier_estimate_us;
  if (wait_limit_ms != nullptr) *wait_limit_ms = engine->wait_limit_ms;
  return engine->quarantined.size();
}

int baton_engine_wait_inherited_blocks(baton_engine* engine, int64_t timeout_ms, baton_event* out) {
  return Guarded("baton_engine_wait_inherited_blocks", [&]() -> int {
    if (engine == nullptr || out == nullptr) return BadArgument("engine or out is NULL");
    const baton::Duration timeout =
        Timeout(timeout_ms).value_or(baton::Duration(Millis(kForeverMs)));
    baton::Result<baton::SessionEvent> event = engine->session->WaitForInheritedBlocks(timeout);
    if (!event.ok()) return Fail(event.status());
    FillEvent(*event, out);
    Remember(engine, *event);
    return Done(baton::OkStatus());
  });
}

int baton_engine_map_quarantined(baton_engine* engine) {
  return Guarded("baton_engine_map_quarantined", [&]() -> int {
    if (engine == nullptr) return BadArgument("engine is NULL");
    baton::Result<std::vector<baton::MappedExtent>> mapped = engine->session->MapQuarantined();
    if (!mapped.ok()) return Fail(mapped.status());
    std::lock_guard lock(engine->kv_mu);
    for (baton::MappedExtent& e : engine->quarantined) {
      for (const baton::MappedExtent& m : *mapped) {
        if (m.first == e.first) e.data = m.data;
      }
    }
    return Done(baton::OkStatus());
  });
}

int baton_engine_release_quarantined(baton_engine* engine) {
  return Guarded("baton_engine_release_quarantined", [&]() -> int {
    if (engine == nullptr) return BadArgument("engine is NULL");
    engine->session->ReleaseQuarantined();
    {
      std::lock_guard lock(engine->kv_mu);
      for (baton::MappedExtent& e : engine->quarantined) e.data = nullptr;
    }
    return Done(baton::OkStatus());
  });
}

int baton_engine_report_kv_adoption(baton_engine* engine, uint32_t adopted, uint64_t tokens,
                                    const char* const* reasons, const uint32_t* counts,
                                    size_t reason_count, double ms) {
  return Guarded("baton_engine_report_kv_adoption", [&]() -> int {
    if (engine == nullptr) return BadArgument("engine is NULL");
    if (reason_count > 0 && (reasons == nullptr || counts == nullptr)) {
      return BadArgument("baton_engine_report_kv_adoption: reasons or counts is NULL");
    }
    baton::KvAdoptionSummary summary{.adopted = adopted, .tokens = tokens, .dropped = {}, .ms = ms};
    for (size_t i = 0; i < reason_count; ++i) {
      if (reasons[i] == nullptr || *reasons[i] == '\0') {
        return BadArgument("baton_engine_report_kv_adoption: an empty reason");
      }
      summary.dropped[reasons[i]] += counts[i];
    }
    return Done(engine->session->ReportKvAdoption(summary));
  });
}

int baton_engine_report_kv_inheritance(baton_engine* engine, int mode, uint32_t blocks,
                                       uint64_t bytes, double ms, double estimate_ms) {
  return Guarded("baton_engine_report_kv_inheritance", [&]() -> int {
    if (engine == nullptr) return BadArgument("engine is NULL");
    baton::KvInheritanceSummary summary{
        .blocks = blocks, .bytes = bytes, .ms = ms, .estimate_ms = estimate_ms};
    switch (mode) {
      case BATON_KV_INHERIT_NONE:
        summary.mode = baton::KvInheritMode::kNone;
        break;
      case BATON_KV_INHERIT_COPIED:
        summary.mode = baton::KvInheritMode::kCopied;
        break;
      case BATON_KV_INHERIT_WAITED:
        summary.mode = baton::KvInheritMode::kWaited;
        break;
      default:
        return Fail(baton::InvalidArgument("baton_engine_report_kv_inheritance: unknown mode " +
                                           std::to_string(mode)));
    }
    return Done(engine->session->ReportKvInheritance(summary));
  });
}

uint32_t baton_engine_crc32c(uint32_t crc, const void* data, size_t bytes) {
  if (data == nullptr || bytes == 0) return crc;
  return baton::proto::Crc32cExtend(crc, data, bytes);
}

}  // extern "C"
