// The C ABI of baton_engine.h over baton::EngineSession. No exception and no C++ type
// crosses it; every failure is a StatusCode value plus a thread-local message.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "standby/sdk/baton_engine_c_internal.h"

namespace baton_c {

thread_local std::string g_last_error;

int Fail(const baton::Status& status) {
  g_last_error = status.message();
  const int code = static_cast<int>(status.code());
  return code == 0 ? static_cast<int>(baton::StatusCode::kInternal) : code;
}

int Done(const baton::Status& status) {
  if (status.ok()) {
    g_last_error.clear();
    return 0;
  }
  return Fail(status);
}

int BadArgument(const char* what) { return Fail(baton::InvalidArgument(what)); }

std::chrono::milliseconds Millis(int64_t ms) { return std::chrono::milliseconds(ms); }

std::optional<baton::Duration> Timeout(int64_t ms) {
  if (ms < 0 || ms > kForeverMs) return std::nullopt;
  return Millis(ms);
}

void FillTensor(const baton::MappedTensor& t, baton_tensor* out) {
  out->name = t.name.c_str();
  out->dtype = static_cast<uint8_t>(t.dtype);
  out->ndim = t.shape.size();
  out->shape = t.shape.data();
  out->data = t.data;
  out->size = t.size;
}

baton_extent ToC(const baton::MappedExtent& e) {
  return baton_extent{.first = e.first, .count = e.count, .data = e.data, .bytes = e.bytes};
}

baton_event_kind KindToC(baton::SessionEventKind kind) {
  switch (kind) {
    case baton::SessionEventKind::kPromoted:
      return BATON_EVENT_PROMOTED;
    case baton::SessionEventKind::kGranted:
      return BATON_EVENT_GRANTED;
    case baton::SessionEventKind::kReclaim:
      return BATON_EVENT_RECLAIM;
    case baton::SessionEventKind::kDrain:
      return BATON_EVENT_DRAIN;
    case baton::SessionEventKind::kResume:
      return BATON_EVENT_RESUME;
    case baton::SessionEventKind::kStop:
      return BATON_EVENT_STOP;
    case baton::SessionEventKind::kDisconnected:
      return BATON_EVENT_DISCONNECTED;
    case baton::SessionEventKind::kControllerLost:
      return BATON_EVENT_CONTROLLER_LOST;
    case baton::SessionEventKind::kControllerBack:
      return BATON_EVENT_CONTROLLER_BACK;
  }
  return BATON_EVENT_NONE;
}

bool IsControllerPresence(baton::SessionEventKind kind) {
  return kind == baton::SessionEventKind::kControllerLost ||
         kind == baton::SessionEventKind::kControllerBack;
}

// The next event the engine asked for: CONTROLLER_LOST and _BACK only with
// BATON_ENGINE_CONTROLLER_EVENTS (an ABI 3 engine does not know them), within `timeout`.
std::optional<baton::SessionEvent> NextWanted(baton_engine* engine,
                                              std::optional<baton::Duration> timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout.value_or(baton::Duration{});
  while (true) {
    std::optional<baton::SessionEvent> event = engine->session->NextEvent(timeout);
    if (!event.has_value() || engine->controller_events || !IsControllerPresence(event->kind)) {
      return event;
    }
    if (timeout.has_value()) {
      timeout = std::max<baton::Duration>(deadline - std::chrono::steady_clock::now(),
                                          baton::Duration::zero());
    }
  }
}

void FillEvent(const baton::SessionEvent& e, baton_event* out) {
  std::memset(out, 0, sizeof(*out));
  out->kind = KindToC(e.kind);
  out->epoch = e.epoch;
  const size_t n = std::min<size_t>(e.extents.size(), BATON_EVENT_MAX_EXTENTS);
  for (size_t i = 0; i < n; ++i) out->extents[i] = ToC(e.extents[i]);
  out->extent_count = static_cast<uint32_t>(n);
  out->extents_truncated = e.extents.size() > n ? 1 : 0;
  out->blocks = e.blocks;
  out->timeout_ms = std::chrono::duration_cast<std::chrono::milliseconds>(e.timeout).count();
  std::strncpy(out->reason, e.reason.c_str(), BATON_EVENT_REASON_BYTES - 1);
}

baton::Result<baton::EngineSessionOptions> OptionsFromC(const baton_engine_options* c) {
  baton::EngineSessionOptions options;
  if (c != nullptr) {
    if (c->socket_path != nullptr) options.launch.socket_path = c->socket_path;
    if (c->launch_token != nullptr) options.launch.launch_token = c->launch_token;
    options.launch.engine_id = c->engine_id;
  }
  // Each field not given is read from its own variable; an error names the one missing.
  BATON_RETURN_IF_ERROR(baton::FillLaunchInfoFromEnv(&options.launch));
  if (c == nullptr) return options;
  if (c->engine_version != nullptr) options.engine_version = c->engine_version;
  if (c->http_address != nullptr) options.http_address = c->http_address;
  options.prefault_weights = c->prefault_weights != 0;
  if (c->connect_timeout_ms > 0) options.connect_timeout = Millis(c->connect_timeout_ms);
  return options;
}

}  // namespace baton_c

using namespace baton_c;  // NOLINT(google-build-using-namespace): this file's own helpers

extern "C" {

int baton_engine_abi_version(void) { return BATON_ENGINE_ABI_VERSION; }

const char* baton_engine_last_error(void) { return g_last_error.c_str(); }

int baton_engine_connect(const baton_engine_options* options, baton_engine** out) {
  return baton_engine_connect_flags(options, 0, out);
}

int baton_engine_connect_flags(const baton_engine_options* options, unsigned flags,
                               baton_engine** out) {
  return Guarded("baton_engine_connect_flags", [&]() -> int {
    if (out == nullptr) return BadArgument("baton_engine_connect: out is NULL");
    *out = nullptr;
    constexpr unsigned kKnown = BATON_ENGINE_USE_DEVICE_MEMORY | BATON_ENGINE_HANDLES_RESUME |
                                BATON_ENGINE_CONTROLLER_EVENTS | BATON_ENGINE_READY_WHEN_WAITING;
    if ((flags & ~kKnown) != 0) {
      return Fail(baton::InvalidArgument("baton_engine_connect_flags: unknown flags " +
                                         std::to_string(flags)));
    }
    baton::Result<baton::EngineSessionOptions> parsed = OptionsFromC(options);
    if (!parsed.ok()) return Fail(parsed.status());
    parsed->use_device_memory = (flags & BATON_ENGINE_USE_DEVICE_MEMORY) != 0;
    parsed->handles_resume = (flags & BATON_ENGINE_HANDLES_RESUME) != 0;
    parsed->ready_when_waiting = (flags & BATON_ENGINE_READY_WHEN_WAITING) != 0;
    if (baton::Status env = baton::ControllerAbsenceFromEnv(&*parsed); !env.ok()) return Fail(env);
    auto session = baton::EngineSession::Connect(*parsed);
    if (!session.ok()) return Fail(session.status());
    auto* engine = new baton_engine;
    engine->session = std::move(session).value();
    engine->controller_events = (flags & BATON_ENGINE_CONTROLLER_EVENTS) != 0;
    *out = engine;
    return Done(baton::OkStatus());
  });
}

int baton_engine_set_controller_absent(baton_engine* engine, int64_t timeout_ms, int action) {
  return Guarded("baton_engine_set_controller_absent", [&]() -> int {
    if (engine == nullptr) return BadArgument("engine is NULL");
    if (timeout_ms < 0 || timeout_ms > kForeverMs) {
      return BadArgument("baton_engine_set_controller_absent: timeout_ms out of range");
    }
    if (action != BATON_ON_CONTROLLER_ABSENT_SERVE && action != BATON_ON_CONTROLLER_ABSENT_STOP) {
      return Fail(baton::InvalidArgument("baton_engine_set_controller_absent: unknown action " +
                                         std::to_string(action)));
    }
    engine->session->SetControllerAbsence(Millis(timeout_ms),
                                          action == BATON_ON_CONTROLLER_ABSENT_STOP
                                              ? baton::ControllerAbsentAction::kStop
                                              : baton::ControllerAbsentAction::kServe);
    return Done(baton::OkStatus());
  });
}

void baton_engine_close(baton_engine* engine) {
  if (engine == nullptr) return;
  try {
    engine->session->Shutdown();
  } catch (...) {
    // Shutdown only stops threads and unmaps; the session is freed either way.
  }
  delete engine;
}

uint64_t baton_engine_id(const baton_engine* engine) {
  return engine == nullptr ? 0 : engine->session->engine_id();
}

uint64_t baton_engine_epoch(const baton_engine* engine) {
  return engine == nullptr ? 0 : engine->session->epoch();
}

int baton_engine_check_epoch(const baton_engine* engine) {
  return Guarded("baton_engine_check_epoch", [&]() -> int {
    if (engine == nullptr) return BadArgument("engine is NULL");
    return Done(engine->session->CheckEpoch());
  });
}

size_t baton_engine_tensor_count(const baton_engine* engine) {
  return engine == nullptr ? 0 : engine->session->weights().tensors.size();
}

int baton_engine_tensor(const baton_engine* engine, size_t index, baton_tensor* out) {
  if (engine == nullptr || out == nullptr) return BadArgument("engine or out is NULL");
  const auto& tensors = engine->session->weights().tensors;
  if (index >= tensors.size()) {
    return Fail(baton::NotFound("tensor index " + std::to_string(index) + " of " +
                                std::to_string(tensors.size())));
  }
  FillTensor(tensors[index], out);
  return Done(baton::OkStatus());
}

int baton_engine_find_tensor(const baton_engine* engine, const char* name, baton_tensor* out) {
  if (engine == nullptr || name == nullptr || out == nullptr) {
    return BadArgument("engine, name or out is NULL");
  }
  const baton::MappedTensor* t = engine->session->weights().Find(name);
  if (t == nullptr) return Fail(baton::NotFound(std::string("no tensor named ") + name));
  FillTensor(*t, out);
  return Done(baton::OkStatus());
}

const void* baton_engine_weights_base(const baton_engine* engine) {
  return engine == nullptr ? nullptr : engine->session->weights().base;
}

int baton_engine_pool(const baton_engine* engine, baton_pool_info* out) {
  if (engine == nullptr || out == nullptr) return BadArgument("engine or out is NULL");
  const baton::PoolView& p = engine->session->pool();
  *out = baton_pool_info{.block_count = p.block_count,
                         .block_bytes = p.block_bytes,
                         .base = p.base,
                         .reserved_bytes = p.reserved_bytes,
                         .huge_pages = p.huge_pages ? 1 : 0};
  return Done(baton::OkStatus());
}

namespace {

int FillDeviceRegion(const std::optional<baton::DeviceRegionView>& region, const char* what,
                     baton_device_region* out) {
  if (!region.has_value()) {
    return Fail(baton::NotFound(std::string("no device ") + what +
                                ": not a CUDA-backend controller, or device memory not asked for"));
  }
  *out = baton_device_region{.device = region->device,
                             .address = region->address,
                             .bytes = region->bytes,
                             .chunk_bytes = region->chunk_bytes,
                             .chunks = region->chunks};
  return Done(baton::OkStatus());
}

}  // namespace

int baton_engine_device_weights(const baton_engine* engine, baton_device_region* out) {
  if (engine == nullptr || out == nullptr) return BadArgument("engine or out is NULL");
  return FillDeviceRegion(engine->session->device_weights(), "weights", out);
}

int baton_engine_device_pool(const baton_engine* engine, baton_device_region* out) {
  if (engine == nullptr || out == nullptr) return BadArgument("engine or out is NULL");
  return FillDeviceRegion(engine->session->device_pool(), "pool", out);
}

int baton_engine_wait_promotion(baton_engine* engine, int64_t timeout_ms, baton_event* out) {
  return Guarded("baton_engine_wait_promotion", [&]() -> int {
    if (engine == nullptr || out == nullptr) return BadArgument("engine or out is NULL");
    auto event = engine->session->WaitForPromotion(Timeout(timeout_ms));
    if (!event.ok()) return Fail(event.status());
    FillEvent(*event, out);
    Remember(engine, *event);
    return Done(baton::OkStatus());
  });
}

int baton_engine_mark_serving(baton_engine* engine) {
  return Guarded("baton_engine_mark_serving", [&]() -> int {
    if (engine == nullptr) return BadArgument("engine is NULL");
    return Done(engine->session->MarkServing());
  });
}

int baton_engine_next_event(baton_engine* engine, int64_t timeout_ms, baton_event* out) {
  return Guarded("baton_engine_next_event", [&]() -> int {
    if (engine == nullptr || out == nullptr) return BadArgument("engine or out is NULL");
    std::optional<baton::SessionEvent> event = NextWanted(engine, Timeout(timeout_ms));
    if (!event.has_value()) {
      std::memset(out, 0, sizeof(*out));
      out->kind = BATON_EVENT_NONE;
      return Done(baton::OkStatus());
    }
    FillEvent(*event, out);
    Remember(engine, *event);
    return Done(baton::OkStatus());
  });
}

int baton_engine_request_blocks(baton_engine* engine, uint32_t blocks) {
  return Guarded("baton_engine_request_blocks", [&]() -> int {
    if (engine == nullptr) return BadArgument("engine is NULL");
    return Done(engine->session->RequestBlocks(blocks));
  });
}

int baton_engine_return_blocks(baton_engine* engine, const baton_extent* extents, size_t count) {
  return Guarded("baton_engine_return_blocks", [&]() -> int {
    if (engine == nullptr || (extents == nullptr && count != 0)) {
      return BadArgument("engine or extents is NULL");
    }
    std::vector<baton::MappedExtent> list;
    for (size_t i = 0; i < count; ++i) {
      list.push_back(baton::MappedExtent{.first = extents[i].first, .count = extents[i].count});
    }
    return Done(engine->session->ReturnBlocks(list));
  });
}

int baton_engine_resume_pending(const baton_engine* engine) {
  return engine != nullptr && engine->session != nullptr && engine->session->resume_pending() ? 1
                                                                                              : 0;
}

int baton_engine_drain_has_successor(const baton_engine* engine) {
  return engine == nullptr || engine->drain_successor.load() ? 1 : 0;
}

int baton_engine_report_progress(baton_engine* engine, uint64_t steps_done, uint32_t work_pending) {
  if (engine == nullptr || engine->session == nullptr) return BadArgument("engine is NULL");
  engine->session->ReportProgress(steps_done, work_pending);
  return 0;
}

int baton_engine_report_drained(baton_engine* engine, uint32_t unfinished) {
  return Guarded("baton_engine_report_drained", [&]() -> int {
    if (engine == nullptr) return BadArgument("engine is NULL");
    return Done(engine->session->ReportDrained(unfinished));
  });
}

int baton_engine_report_error(baton_engine* engine, int code, const char* message) {
  return Guarded("baton_engine_report_error", [&]() -> int {
    if (engine == nullptr) return BadArgument("engine is NULL");
    const int max_code = static_cast<int>(baton::StatusCode::kIoError);
    const auto status_code = (code <= 0 || code > max_code) ? baton::StatusCode::kInternal
                                                            : static_cast<baton::StatusCode>(code);
    return Done(engine->session->ReportError(
        baton::Status(status_code, message == nullptr ? "unspecified error" : message)));
  });
}

size_t baton_engine_extents(const baton_engine* engine, baton_extent* out, size_t capacity) {
  if (engine == nullptr) return 0;
  std::vector<baton::MappedExtent> extents;
  try {
    extents = engine->session->extents();
  } catch (const std::exception& e) {
    Fail(baton::Internal(std::string("baton_engine_extents: ") + e.what()));
    return 0;
  }
  for (size_t i = 0; i < extents.size() && i < capacity && out != nullptr; ++i) {
    out[i] = ToC(extents[i]);
  }
  return extents.size();
}

int baton_engine_register_nccl_comm(baton_engine* engine, void* comm, const char* label) {
  return Guarded("baton_engine_register_nccl_comm", [&]() -> int {
    if (engine == nullptr || comm == nullptr) return BadArgument("engine or comm is NULL");
    return Done(engine->session->WatchNcclComm(comm, label == nullptr ? "" : label));
  });
}

int baton_engine_unregister_nccl_comm(baton_engine* engine, void* comm) {
  return Guarded("baton_engine_unregister_nccl_comm", [&]() -> int {
    if (engine == nullptr || comm == nullptr) return BadArgument("engine or comm is NULL");
    return Done(engine->session->UnwatchNcclComm(comm));
  });
}

int baton_engine_report_cuda_error(baton_engine* engine, int cuda_result, const char* where) {
  return Guarded("baton_engine_report_cuda_error", [&]() -> int {
    if (engine == nullptr) return BadArgument("engine is NULL");
    return Done(engine->session->ReportCudaError(cuda_result, where == nullptr ? "CUDA" : where));
  });
}

}  // extern "C"
