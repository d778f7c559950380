// The test engine's flags (baton_test_engine_helper, tests/chaos/test_engine_helper_main.cc).
//
// Flags:
//   --violations-dir DIR     where a violation is written down
//   --rogue-file PATH        if PATH exists, claim it (rename) and misbehave as its content
//                            says: bad-frame, stale-epoch, foreign-return, foreign-lease,
//                            wrong-id, tamper-memory (speaking the raw protocol instead of
//                            the SDK). tamper-memory tries to resize the pool and the weight
//                            arena and to write the arena; it writes what happened to
//                            <violations-dir>/../tamper-<id>.txt, and a violation file if any
//                            attempt got through
//   --crash-if-id-above N    exit(3) at once when this engine's id is above N
//   --busy-ms N              after promotion, the compute thread spins N ms per round
//   --exit-after-promote     exit(0) right after MarkServing (a clean early exit)
//   --promote-delay-ms N     wait N ms between the promotion and MarkServing (a slow start)
//   --drain-ms N             a drain takes N ms (requests finishing), unless it is called off
//   --reclaim-delay-ms N     answer a Reclaim N ms late (a busy engine)
//   --protocol-2             an engine that does not handle Resume (speaks protocol 2)
//   --hang-registering-id N  engine N stops itself (SIGSTOP, every thread) once the SDK has
//                            mapped the weight arena, before the registration ends: a hang
//                            while registering
//   --device-memory          take a CUDA-backend controller's device memory: check that the
//                            weights' device copy equals the host arena, and stamp the
//                            block headers in the device pool instead of the host pool, through
//                            the driver's copies (a GPU, or the fake driver's emulated device)
//   --fill-blocks            fill every block it holds whole with words of its own and check
//                            them every few rounds: a foreign word is a violation (engine_worker.h)
//   --worker-mb N            after its promotion, fork a worker that holds N MiB and writes into
//                            its blocks until it is killed (engine_worker.h); on the Grant of
//                            blocks another engine held, a worker of that engine still running
//                            is a violation
//   --read-quarantine        after a promotion before the old primary's barrier (device pool),
//                            map its quarantined blocks read-only (MapQuarantined), read their
//                            headers through the driver and write what they carry to
//                            <violations-dir>/../quarantine-read-<id>.txt; keep them mapped until
//                            their Grant (which makes their chunks writable in place), then
//                            release the quarantine
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace baton {

struct Flags {
  std::string violations_dir;
  std::string rogue_file;
  uint64_t crash_if_id_above = 0;
  uint64_t hang_registering_id = 0;
  int busy_ms = 0;
  bool exit_after_promote = false;
  bool device_memory = false;
  int promote_delay_ms = 0;
  int drain_ms = 0;
  int reclaim_delay_ms = 0;
  bool protocol_2 = false;
  bool fill_blocks = false;
  int worker_mb = -1;  // no worker
  bool read_quarantine = false;
};

inline bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= argc) return false;
      *out = argv[++i];
      return true;
    };
    std::string v;
    if (a == "--violations-dir") {
      if (!value(&f->violations_dir)) return false;
    } else if (a == "--rogue-file") {
      if (!value(&f->rogue_file)) return false;
    } else if (a == "--crash-if-id-above") {
      if (!value(&v)) return false;
      f->crash_if_id_above = std::stoull(v);
    } else if (a == "--hang-registering-id") {
      if (!value(&v)) return false;
      f->hang_registering_id = std::stoull(v);
    } else if (a == "--busy-ms") {
      if (!value(&v)) return false;
      f->busy_ms = std::stoi(v);
    } else if (a == "--promote-delay-ms") {
      if (!value(&v)) return false;
      f->promote_delay_ms = std::stoi(v);
    } else if (a == "--drain-ms") {
      if (!value(&v)) return false;
      f->drain_ms = std::stoi(v);
    } else if (a == "--reclaim-delay-ms") {
      if (!value(&v)) return false;
      f->reclaim_delay_ms = std::stoi(v);
    } else if (a == "--protocol-2") {
      f->protocol_2 = true;
    } else if (a == "--fill-blocks") {
      f->fill_blocks = true;
    } else if (a == "--worker-mb") {
      if (!value(&v)) return false;
      f->worker_mb = std::stoi(v);
    } else if (a == "--exit-after-promote") {
      f->exit_after_promote = true;
    } else if (a == "--device-memory") {
      f->device_memory = true;
    } else if (a == "--read-quarantine") {
      f->read_quarantine = true;
    } else {
      std::fprintf(stderr, "test engine: unknown flag %s\n", a.c_str());
      return false;
    }
  }
  return true;
}

}  // namespace baton
