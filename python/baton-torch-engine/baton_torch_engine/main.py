"""baton-torch-engine: the Llama-style models of the reference engine, in PyTorch.

Under a controller (--controller, or BATON_SOCKET in the environment, as the controller
launches it) it connects through baton_engine and stands by half-started: the weights are the
controller's arena (--device cuda: its device copy), wrapped as tensors without a copy; the
HTTP server already listens and answers 503; a step is rehearsed on the compute thread.
Promoted, it keeps its KV cache in the granted blocks (on CUDA the device pool's), adopts
the KV its predecessor left in them (KV-warm failover: kv_inherit.py; --kv-handoff off turns
it off), marks itself serving, batches its requests (batching.py), and follows the controller's events
(grants, reclaims, drains, resume, stop). Standalone (--standalone, or neither --controller
nor BATON_SOCKET) it reads the weights from the model's safetensors files into its own memory
before it listens, as vLLM's and SGLang's loaders do: the cold start Baton is measured
against (--map-weights maps them instead). With BATON_ENGINE_KEYS in the environment (the
controller's `[engine] key_file`), its HTTP API serves only requests that carry one of the keys
(server.py); a malformed value ends it before it listens.

    baton-torch-engine --model DIR [--host H] [--port N] [--port-file F]
                       [--served-model-name NAME] [--engine-version LABEL] [--threads K]
                       [--device cpu|cuda|cuda:N] [--tile-rows R]
                       [--max-batch S] [--max-step-tokens T] [--step-interval-ms N]
                       [--standalone [--map-weights] [--kv-blocks N] [--block-bytes B]]
                       [--controller SOCKET --token T --engine-id ID]
                       [--kv-handoff on|off] [--kv-format NAME] [--kv-keep-ms N]
                       [--keep-library-pages]
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time


def parse(argv):
    p = argparse.ArgumentParser(prog="baton-torch-engine", description=__doc__.splitlines()[0])
    from baton_torch_engine import __version__
    p.add_argument("--version", action="version", version=f"baton-torch-engine {__version__}")
    p.add_argument("--model", required=True, help="model directory (config.json)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--port-file", default="")
    p.add_argument("--served-model-name", default="")
    p.add_argument("--engine-version", default="baton-torch-engine")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    p.add_argument("--device", default="cpu",
                   help="cpu (default), cuda or cuda:N: where the model computes; under a "
                   "controller, cuda takes its device weights and device pool")
    p.add_argument("--tile-rows", type=int, default=None,
                   help="cuda: rows per product tile (default 128; 0: the batch as it comes, "
                   "not batch-invariant)")
    p.add_argument("--max-batch", type=int, default=16, help="sequences per step")
    p.add_argument("--max-step-tokens", type=int, default=256,
                   help="tokens per step (prompts are prefilled in chunks to fit)")
    p.add_argument("--step-interval-ms", type=int, default=0,
                   help="pace: a step at most every N ms (default 0: as fast as it computes)")
    p.add_argument("--standalone", action="store_true",
                   help="read the weights from the model's files (the default without "
                   "--controller or BATON_SOCKET)")
    p.add_argument("--map-weights", action="store_true",
                   help="standalone: map the safetensors files instead of reading them into "
                   "memory (the first forward pass then pages them in)")
    p.add_argument("--kv-blocks", type=int, default=64,
                   help="standalone: KV cache blocks of its own (default 64; under a "
                   "controller the pool's blocks are used)")
    p.add_argument("--block-bytes", type=int, default=1 << 20,
                   help="standalone: bytes per KV block (default 1 MiB)")
    p.add_argument("--controller", default="")
    p.add_argument("--token", default="")
    p.add_argument("--engine-id", type=int, default=0)
    p.add_argument("--role", default="", help="accepted for the engine command's {role}")
    p.add_argument("--kv-handoff", choices=["on", "off"], default="on",
                   help="under a controller: leave a record of each sequence in its KV blocks, "
                   "and on promotion continue the predecessor's sequences from theirs "
                   "(KV-warm failover); default on")
    p.add_argument("--kv-format", default="baton-torch-engine-kv/1",
                   help="the KV format name in the records' identity; engines of other names "
                   "adopt nothing")
    p.add_argument("--kv-keep-ms", type=int, default=30000,
                   help="how long adopted KV waits for its request to come back")
    p.add_argument("--keep-library-pages", action="store_true",
                   help="under a controller: keep the standby's library page-table entries "
                   "(see baton_engine.libmaps)")
    args = p.parse_args(argv)
    if not 0 <= args.step_interval_ms <= 60000:
        p.error(f"--step-interval-ms {args.step_interval_ms} is outside [0, 60000]")
    return args


def log(text: str) -> None:
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"
    print(f"{stamp} INFO baton-torch-engine[{os.getpid()}]: {text}", file=sys.stderr, flush=True)


def write_port(path: str, port: int) -> None:
    if path:
        with open(path + ".tmp", "w") as f:
            f.write(f"{port}\n")
        os.rename(path + ".tmp", path)


def build_state(args):
    """The model's config and the HTTP state (the parser), before any weight is there."""
    from .llama import LlamaConfig
    from .openai_requests import Parser
    from .server import State
    config = LlamaConfig.load(args.model)
    # The model folder's name, as the controller's fleet record names the model.
    name = args.served_model_name or os.path.basename(os.path.normpath(args.model)) or args.model
    state = State(Parser(name, config.vocab_size, config.max_position_embeddings,
                         config.bos_token_id), config.max_position_embeddings,
                  args.engine_keys)
    return config, state


def start_device(args):
    from .device import ComputeDevice
    device = ComputeDevice.parse(args.device, args.tile_rows)
    log(device.start())
    return device


def generator_options(args, device, engine=None) -> dict:
    return dict(max_batch=args.max_batch, max_step_tokens=args.max_step_tokens, log=log,
                step_interval=args.step_interval_ms / 1000.0,
                on_error=lambda e: on_step_error(e, device, engine),
                on_progress=engine.report_progress if engine is not None else None)


def on_step_error(error: BaseException, device, engine) -> int:
    """A failed step's status for its requests: a CUDA error is reported through the SDK (a
    sticky one fences this engine, and the router replays on the next primary): 503."""
    if not device.is_cuda:
        return 500
    from .device import cuda_error_code
    code = cuda_error_code(error)
    if code == 0:
        return 500
    if engine is not None:
        from baton_engine import BatonError
        try:
            engine.report_cuda_error(code, "baton-torch-engine forward step")
        except BatonError as e:
            log(f"CUDA error reported: {e}")
    return 503


def run_standalone(args) -> int:
    from .generation import Generator
    from .kv_blocks import KvBlocks
    from .llama import LlamaModel
    from .safetensors_files import read_model
    from .server import serve
    device = start_device(args)
    started = time.monotonic()
    weights, buffers = read_model(args.model, mapped=args.map_weights)
    if device.is_cuda:  # a cold start's own copy on the device
        weights = {n: t.to(device.torch) for n, t in weights.items()}
    log(f"{'mapped' if args.map_weights else 'read'} the weights of {args.model} in "
        f"{(time.monotonic() - started) * 1e3:.1f} ms")
    config, state = build_state(args)
    model = LlamaModel(config, weights, device)
    kv = KvBlocks.private(config, args.block_bytes, args.kv_blocks, model.kv_dtype,
                          device.torch)
    state.generator = Generator(model, kv, config.eos_token_ids,
                                **generator_options(args, device))
    state.serving = True
    serve(state, args.host, args.port, lambda port: write_port(args.port_file, port))
    log(f"serving {args.model} standalone")
    threading.Event().wait()
    return 0


def connect(args, device, bound):
    """The half start: connected and registered, the weights (and on CUDA the device pool)
    mapped; returns (engine, weights, device on the controller's GPU)."""
    from baton_engine import Engine, NotFound
    from baton_engine.tensors import device_weight_tensors, weight_tensors
    engine = Engine.connect(socket_path=args.controller or None,
                            launch_token=args.token or None, engine_id=args.engine_id,
                            engine_version=args.engine_version,
                            http_address=f"{args.host}:{bound['port']}",
                            use_device_memory=device.is_cuda,
                            # Ready once stand_by() waits: the model built, a step rehearsed.
                            ready_when_waiting=True)
    if not device.is_cuda:
        return engine, weight_tensors(engine), device
    try:
        region = engine.device_weights()
    except NotFound as e:
        engine.close()
        raise RuntimeError("--device cuda needs a controller with device memory ([gpu] backend "
                           f"= \"cuda\"): {e.reason}") from e
    if device.index is not None and device.index != region.device:
        engine.close()
        raise RuntimeError(f"--device {device.name}: the controller's device memory is on "
                           f"cuda:{region.device}")
    if device.index is None:
        device = device.with_index(region.device)
        log(device.start())
    return engine, device_weight_tensors(engine), device


def run_under_controller(args) -> int:
    from .llama import LlamaModel
    from .pool_kv import PoolKv
    from .server import serve
    started = time.monotonic()
    device = start_device(args)
    config, state = build_state(args)
    bound = {}
    serve(state, args.host, args.port, lambda port: bound.update(port=port))  # 503 for now
    engine, weights, device = connect(args, device, bound)
    with engine:
        model = LlamaModel(config, weights, device)
        kv = PoolKv(engine, model)
        generator = kv.generator(**generator_options(args, device, engine))
        if args.kv_handoff == "on":
            from .kv_handoff import KvHandoff
            generator.scheduler.handoff = KvHandoff(
                kv.blocks, kv.identity(args.kv_format), kv.block_address,
                lambda: engine.epoch, keep_s=max(args.kv_keep_ms, 0) / 1e3, log=log)
        state.handoff = generator.scheduler.handoff
        try:
            promoted_at = stand_by(args, engine, model, kv, generator, bound["port"], started)
            if promoted_at is not None:
                serve_events(engine, state, kv, generator, promoted_at)
        finally:
            generator.stop()  # no step may touch the pool once the session unmaps it
    return 0


def since_process_start_ms() -> float:
    """Milliseconds since this process was made, by its start time in /proc (in clock ticks,
    10 ms on most kernels); NaN where that cannot be read."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # from field 3, the state, on
        start_s = int(fields[22 - 3]) / os.sysconf("SC_CLK_TCK")
        return (time.clock_gettime(time.CLOCK_BOOTTIME) - start_s) * 1e3
    except (OSError, ValueError, IndexError):
        return float("nan")


def stand_by(args, engine, model, kv, generator, port: int, started: float):
    """The standby's wait: library pages dropped, a step rehearsed on the compute thread,
    then the promotion, whose blocks the cache takes. Returns when the promotion came (its
    monotonic time), None when told to stop first."""
    from baton_engine import FailedPrecondition
    from .rehearsal import rehearse
    if not args.keep_library_pages:
        drop_library_pages()
    at = time.monotonic()
    generator.scheduler.call(lambda: rehearse(model, kv.block_bytes))
    log(f"rehearsed a promotion and a decode step in {(time.monotonic() - at) * 1e3:.1f} ms")
    block_copy_ms = 0.0
    if generator.scheduler.handoff is not None:  # a quarantined block's KV is copied this fast
        from .kv_copy_cost import measure_block_copy_ms
        try:
            block_copy_ms = generator.scheduler.call(
                lambda: measure_block_copy_ms(kv.blocks, model.device))
            log(f"a quarantined block's kv is copied in {block_copy_ms:.3f} ms (measured)")
        except (RuntimeError, MemoryError) as e:  # no estimate: a promotion waits for the barrier
            log(f"the copy of a quarantined block's kv could not be measured ({e}): "
                "promotions wait for the barrier")
    write_port(args.port_file, port)
    log(f"standby {engine.id} ready in {(time.monotonic() - started) * 1e3:.1f} ms, "
        f"{since_process_start_ms():.0f} ms after its process started (the interpreter's "
        "start and the imports included)")
    try:
        promoted = engine.wait_promotion()
    except FailedPrecondition as e:
        log(f"stopped as a standby: {e}")
        return None
    at = time.monotonic()
    if generator.scheduler.handoff is None:
        kv.take(promoted.extents)
    else:
        from .kv_inherit import inherit_kv
        inherit_kv(engine, kv, generator.scheduler.handoff, generator.scheduler, promoted, log,
                   block_copy_ms)
    return at


def serve_events(engine, state, kv, generator, at: float) -> None:
    """Promoted: serves, and follows the controller's events until told to stop."""
    from baton_engine import EventKind
    state.generator = generator
    state.serving = True
    engine.mark_serving()
    log(f"engine {engine.id} serving at epoch {engine.epoch} with {kv.blocks.total} KV blocks, "
        f"{(time.monotonic() - at) * 1e3:.2f} ms after its promotion")
    for event in engine.events():
        if event.kind == EventKind.GRANTED:
            kv.take(event.extents)
        elif event.kind == EventKind.RECLAIM:
            engine.return_blocks(kv.give(event.blocks))
        elif event.kind == EventKind.DRAIN:
            with engine.drain(event) as d:
                with state.lock:  # under the lock the HTTP threads admit requests with
                    state.stopping = True
                if generator.scheduler.handoff is not None and event.successor:
                    # The next primary continues them from their KV: no need to wait for them.
                    handed = generator.scheduler.call(generator.scheduler.hand_over)
                    log(f"handed {handed} keyed requests over to the next primary")
                elif not event.successor:
                    with state.lock:
                        running = state.in_flight
                    log(f"no next primary follows this drain: finishing {running} requests")
                d.unfinished = wait_idle(state, event.timeout_ms, engine)
        elif event.kind == EventKind.RESUME:
            state.stopping = False
        elif event.kind in (EventKind.STOP, EventKind.DISCONNECTED):
            with state.lock:
                state.stopping = True
            log(f"{event.kind.name.lower()}: {event.reason}")


def drop_library_pages() -> None:
    """Sheds what importing PyTorch left mapped (baton_engine.libmaps), so that a kill of this
    engine is seen sooner; logs what it dropped, or why it dropped nothing."""
    from baton_engine.libmaps import drop_library_pages as drop
    at = time.monotonic()
    try:
        dropped = drop()
    except OSError as e:
        log(f"library pages kept: {e}")
        return
    log(f"dropped the page-table entries of {dropped.kib // 1024} MiB of library pages "
        f"({dropped.mappings} mappings) in {(time.monotonic() - at) * 1e3:.1f} ms")


def wait_idle(state, timeout_ms: int, engine) -> int:
    """Waits for the requests in flight to end (or the drain to be called off); returns how
    many are left."""
    deadline = time.monotonic() + max(timeout_ms, 0) / 1e3
    while time.monotonic() < deadline and not engine.resume_pending():
        with state.lock:
            if state.in_flight == 0:
                return 0
        time.sleep(0.005)
    with state.lock:
        return state.in_flight


# The heap on transparent huge pages: glibc's malloc asks for them, every thread allocates
# from the one (main) arena that does, and Python's objects come from malloc too.
HUGE_PAGE_HEAP = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1:glibc.malloc.arena_max=1",
                  "PYTHONMALLOC": "malloc"}


def reexec_with_huge_page_heap() -> None:
    """Runs this same command again, once, with its heap on transparent huge pages
    (HUGE_PAGE_HEAP), unless GLIBC_TUNABLES already sets glibc.malloc.hugetlb
    (glibc.malloc.hugetlb=0 turns all of it off). A PYTHONMALLOC of the caller's is kept.

    A killed engine's death is seen when the kernel has torn its memory down and closed its
    sockets, and for a process that has imported PyTorch most of that teardown is its heap in
    4 KiB pages. On the 2-core VM, medians of 10 kills of such a process: 23-26 ms as it is,
    13-16 ms with glibc.malloc.hugetlb=1, 11 ms with all three settings. glibc 2.35 and later
    read the tunables; an older glibc ignores them."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb" in tunables:
        return
    glibc = HUGE_PAGE_HEAP["GLIBC_TUNABLES"]
    env = dict(os.environ, GLIBC_TUNABLES=f"{tunables}:{glibc}" if tunables else glibc)
    env.setdefault("PYTHONMALLOC", HUGE_PAGE_HEAP["PYTHONMALLOC"])
    try:
        os.execve(sys.executable, [sys.executable] + sys.orig_argv[1:], env)
    except OSError as e:  # the engine still runs, on 4 KiB pages
        log(f"not re-executed with its heap on huge pages: {e}")


def main(argv=None) -> int:
    if argv is None:
        reexec_with_huge_page_heap()
    args = parse(sys.argv[1:] if argv is None else argv)
    from .server import ENGINE_KEYS_ENV, engine_keys_from_env
    try:  # read once, before the weights and the port
        args.engine_keys = engine_keys_from_env(os.environ)
    except ValueError as e:
        log(f"failed: {e}")
        return 2
    if args.engine_keys:
        log(f"{len(args.engine_keys)} engine key(s) from {ENGINE_KEYS_ENV}: requests other "
            "than GET /health and GET /metrics need one")
    try:
        import torch
    except ImportError as e:
        log(f"PyTorch is missing ({e}); on Debian: apt-get install python3-torch")
        return 2
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    try:
        if args.standalone or not (args.controller or os.environ.get("BATON_SOCKET")):
            return run_standalone(args)
        return run_under_controller(args)
    except Exception as e:  # one line that says why, not a traceback, for the controller's log
        log(f"failed: {type(e).__name__}: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
