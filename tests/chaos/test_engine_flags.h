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
//   --promote-hold-file P    after its promotion, wait while file P exists before MarkServing:
//                            a slow start the test begins and ends when it chooses
//   --drain-ms N             a drain takes N ms (requests finishing), unless it is called off
//   --drain-hold-file P      a drain also lasts while file P exists (unless called off): a
//                            drain the test ends when it chooses
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
#include <map>
#include <string>

namespace baton {

struct Flags {
  std::string violations_dir;
  std::string rogue_file;
  std::string promote_hold_file;
  std::string drain_hold_file;
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
  const std::map<std::string, std::string*> texts = {{"--violations-dir", &f->violations_dir},
                                                     {"--rogue-file", &f->rogue_file},
                                                     {"--promote-hold-file", &f->promote_hold_file},
                                                     {"--drain-hold-file", &f->drain_hold_file}};
  const std::map<std::string, uint64_t*> ids = {{"--crash-if-id-above", &f->crash_if_id_above},
                                                {"--hang-registering-id", &f->hang_registering_id}};
  const std::map<std::string, int*> numbers = {{"--busy-ms", &f->busy_ms},
                                               {"--promote-delay-ms", &f->promote_delay_ms},
                                               {"--drain-ms", &f->drain_ms},
                                               {"--reclaim-delay-ms", &f->reclaim_delay_ms},
                                               {"--worker-mb", &f->worker_mb}};
  const std::map<std::string, bool*> switches = {{"--protocol-2", &f->protocol_2},
                                                 {"--fill-blocks", &f->fill_blocks},
                                                 {"--exit-after-promote", &f->exit_after_promote},
                                                 {"--device-memory", &f->device_memory},
                                                 {"--read-quarantine", &f->read_quarantine}};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (auto it = switches.find(a); it != switches.end()) {
      *it->second = true;
      continue;
    }
    const bool takes_value = texts.count(a) + ids.count(a) + numbers.count(a) != 0;
    if (!takes_value) {
      std::fprintf(stderr, "test engine: unknown flag %s\n", a.c_str());
      return false;
    }
    if (i + 1 >= argc) return false;
    const std::string v = argv[++i];
    if (auto t = texts.find(a); t != texts.end()) *t->second = v;
    if (auto n = ids.find(a); n != ids.end()) *n->second = std::stoull(v);
    if (auto n = numbers.find(a); n != numbers.end()) *n->second = std::stoi(v);
  }
  return true;
}

}  // namespace baton
