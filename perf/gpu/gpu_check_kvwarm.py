#!/usr/bin/env python3
"""perf/gpu_check's kvwarm step: KV-warm failover of the PyTorch engine on the GPU.

A pair of baton-torch-engine --device cuda (the controller's CUDA backend: device weights and
device pool) behind baton-router, perf/soak's stack (perf/soak_stack.py). One long-context
stream (--context prompt bytes, a token each, --max-tokens generated) is streamed through
the router undisturbed, then again with the primary killed with kill -9 once --cut-after
tokens have arrived; the time from the kill to the stream's next token is taken with the
engines' KV-warm handoff on (the new primary continues from the KV the dead one left in the
pool) and off (it prefills the whole context again), --trials times each, a fresh pair per
mode. The interrupted streams must equal the undisturbed one token for token.

    gpu_check_kvwarm.py --bin DIR --device cuda:N --out DIR [--model-dir DIR] [--context T]
                        [--max-tokens G] [--cut-after K] [--trials N]

The last line of stdout is one JSON object: warm_next_token_ms and reprefill_next_token_ms
(p50 over the trials), reprefill_over_warm, adopted (sequences the warm trials' new primaries
adopted), tokens_not_prefilled (their baton_engine_kv_tokens_not_recomputed_total),
inherited (how many warm trials took the dead primary's quarantined KV in each way: "copied"
device to device before its barrier, "waited" for it, "none"; `batonctl timeline`),
mismatched (streams that differ from the undisturbed one), missed_kills (kills that landed
after the engine had sent the whole stream: no failover to time), ok (every stream equal, a
failover timed in each mode, every warm one adopted, none without the handoff). Without PyTorch with CUDA it
is {"skipped": reason}. --device cpu runs the same on the CPU (a check of this program on any
machine; its timings say nothing of a GPU's).
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import types
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # perf/: baton_perf, soak_stack

from baton_perf import batonctl, metric, serving_primary  # noqa: E402
from soak_stack import Stack  # noqa: E402


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin", required=True)
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--out", required=True)
    p.add_argument("--model-dir", default="")
    p.add_argument("--context", type=int, default=1700)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--cut-after", type=int, default=8)
    p.add_argument("--trials", type=int, default=2)
    return p.parse_args(argv)


def cuda_torch():
    """'' when PyTorch with CUDA is here, else why not (numpy is not needed: the engines wrap
    Baton's device memory through DLPack)."""
    r = subprocess.run([sys.executable, "-c", "import torch, sys; "
                        "sys.exit(0 if torch.cuda.is_available() else 3)"],
                       capture_output=True, text=True)
    if r.returncode == 0:
        return ""
    return ("PyTorch with CUDA is not installed here" if r.returncode == 3 else
            f"PyTorch is missing: {r.stderr.strip().splitlines()[-1] if r.stderr else ''}")


class Stopped(Exception):
    """SIGTERM: the step's time is up (perf/gpu_check's timeout)."""


def stop_on_sigterm(*_):
    raise Stopped("stopped by SIGTERM: the step's time ran out")


def stream(port, body, on_token=None):
    """Streams `body` through the router: (token ids, None); on_token(n) after each event."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    ids = []
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(f"error event: {event['error']}")
            for choice in event.get("choices", []):
                got = choice.get("token_ids") or []
                ids.extend(got)
                if got and on_token:
                    on_token(len(ids))
    return ids, None


def failover_next_token(port):
    """The router's own measure (sum, count) of the time from a failover to the next token of
    the streams it replayed (baton_router_failover_next_token_seconds): the client cannot tell
    a token the dead primary sent before the kill, still in the socket, from the next one."""
    return (metric(port, "baton_router_failover_next_token_seconds_sum") or 0.0,
            metric(port, "baton_router_failover_next_token_seconds_count") or 0.0)


def trial(stack, body, want, cut_after, log):
    """One stream cut by kill -9 of the primary: (next token ms after the kill, matched)."""
    primary = serving_primary(stack.status())
    killed = {}
    sum0, count0 = failover_next_token(stack.port)

    def on_token(n):
        if n >= cut_after and not killed:
            os.kill(int(primary["pid"]), signal.SIGKILL)
            killed["n"] = n

    ids, _ = stream(stack.port, body, on_token)
    sum1, count1 = failover_next_token(stack.port)
    ms = (sum1 - sum0) / (count1 - count0) * 1e3 if count1 > count0 else None
    log(f"next token {ms} ms after the failover (the router's measure); {len(ids)} tokens, "
        f"{'equal to' if ids == want else 'NOT equal to'} the undisturbed stream")
    stack.wait_ready(primary["id"], 180)
    return ms, ids == want


def run_mode(args, model_dir, mode, body, log):
    out = os.path.join(args.out, f"kv-{mode}")
    os.makedirs(out, exist_ok=True)
    stack_args = types.SimpleNamespace(engine="torch", device=args.device, out=out,
                                       watchdog_s=30, engine_flags=["--kv-handoff", mode])
    stack = Stack(stack_args, args.bin, model_dir, log)
    result = {"next_token_ms": [], "mismatched": 0, "adopted": 0, "tokens_not_prefilled": 0,
              "missed": 0, "inherited": {}}
    try:
        stack.start()
        want, _ = stream(stack.port, body)
        if len(want) <= args.cut_after:
            raise RuntimeError(f"the stream ended after {len(want)} tokens, before the cut")
        for _ in range(args.trials):
            ms, matched = trial(stack, body, want, args.cut_after, log)
            result["mismatched"] += 0 if matched else 1
            if ms is not None:
                result["next_token_ms"].append(ms)
            else:  # the engine had sent the whole stream before it died: nothing to replay
                result["missed"] += 1
                log("the kill landed after the engine had finished the stream: not counted")
            # How the new primary took the dead one's quarantined KV: copied device to device
            # before the barrier, or waited for it (batonctl timeline's kv_inherited).
            timeline = batonctl(stack.bin, stack.socket, "timeline")[1].get("timeline", {})
            how = timeline.get("kv_inherited", {}).get("mode", "none")
            result["inherited"][how] = result["inherited"].get(how, 0) + 1
            log(f"the quarantined kv: {how} ({timeline.get('kv_inherited', {})})")
            port = int(serving_primary(stack.status())["http_address"].rsplit(":", 1)[1])
            for key, series in (("adopted", "baton_engine_kv_adopted_sequences_total"),
                                ("tokens_not_prefilled",
                                 "baton_engine_kv_tokens_not_recomputed_total")):
                result[key] += max(0, int(metric(port, series) or 0))
    finally:
        stack.stop()
    return result


def ensure_model(args):
    if args.model_dir:
        return os.path.abspath(args.model_dir)
    model = os.path.join(args.out, "model")
    if not os.path.exists(os.path.join(model, "config.json")):
        subprocess.run([os.path.join(args.bin, "baton-mkmodel"), "--out", model, "--preset",
                        "small", "--seed", "1"], check=True, stdout=subprocess.DEVNULL)
    return model


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    # The stack is stopped on the way out (run_mode's finally) and the JSON line says why.
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    why = "" if args.device == "cpu" else cuda_torch()
    if why:
        print(json.dumps({"skipped": why}))
        return 0
    os.makedirs(args.out, exist_ok=True)
    args.out = os.path.abspath(args.out)
    logf = open(os.path.join(args.out, "kvwarm.log"), "a")

    def log(text):
        print(f"kvwarm: {text}", file=logf, flush=True)
        print(f"kvwarm: {text}", file=sys.stderr, flush=True)

    model_dir = ensure_model(args)
    prompt = ("A long context whose KV outlives its engine. " * (args.context // 45 + 1))
    body = {"model": "baton-default", "prompt": prompt[:args.context], "seed": 99,
            "temperature": 0.7, "max_tokens": args.max_tokens, "stream": True}
    result = {"context_tokens": args.context, "trials": args.trials, "device": args.device}
    try:
        warm = run_mode(args, model_dir, "on", body, log)
        cold = run_mode(args, model_dir, "off", body, log)
    except Exception as e:  # the step reports what failed
        result.update(ok=False, error=f"{type(e).__name__}: {e}")
        print(json.dumps(result))
        return 1
    p50 = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    w, c = p50(warm["next_token_ms"]), p50(cold["next_token_ms"])
    result.update(warm_next_token_ms=w, reprefill_next_token_ms=c,
                  reprefill_over_warm=round(c / w, 2) if w and c else None,
                  adopted=warm["adopted"], tokens_not_prefilled=warm["tokens_not_prefilled"],
                  adopted_without_handoff=cold["adopted"], inherited=warm["inherited"],
                  mismatched=warm["mismatched"] + cold["mismatched"],
                  missed_kills=warm["missed"] + cold["missed"])
    result["ok"] = bool(w and c and result["mismatched"] == 0 and
                        warm["adopted"] >= len(warm["next_token_ms"]) and cold["adopted"] == 0)
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
