#!/usr/bin/env python3
"""perf/gpu_check's verdict: the driver's JSON joined with the steps that ran after it.

    gpu_check_merge.py --driver JSON --out DIR [--torch-cuda] [--torch-unusable WHY]
                       [--asked-off serve,kvwarm]

Reads the driver's JSON (baton-perf-gpu-check's), DIR/header_reads.json and the steps' results
DIR/serve.json and DIR/kvwarm.json (each's last line; a step not reached has no file, a step
under way has its "did not finish" placeholder), and writes DIR/gpu_check.json. perf/gpu_check
runs it after each step, so DIR always holds whatever finished. A step that failed fails the
run. --torch-cuda: torch.cuda.is_available() is true on this host; then a PyTorch step (torch,
serve, kvwarm) that did not run on the GPU fails the run, `torch_skipped` saying which and
why, unless it was turned off on the command line (--asked-off). --torch-unusable: why the
engines could not use PyTorch on the GPU although it has CUDA (the torch step then ran them
without --expect-torch). Exit 1 when the run failed, else 0.
"""
import argparse
import json
import os
import sys

STEPS = ("serve", "kvwarm")


def header_reads(path):
    """baton_micro_bench's PoolReadHeaders results, by way and thread count."""
    try:
        bench = json.load(open(path))
        # BM_PoolReadHeaders/THREADS/VIEW/real_time: VIEW 1 copies from the header view, 0
        # preads.
        by_way = {"pread": {}, "view": {}}
        for b in bench["benchmarks"]:
            if b.get("time_unit") != "ms":
                continue
            parts = b["name"].split("/")
            way = "view" if len(parts) > 2 and parts[2] == "1" else "pread"
            by_way[way][parts[1]] = round(b["real_time"], 3)
        return {"blocks": 32768, "cpus": bench["context"].get("num_cpus"),
                "wall_ms_by_threads": by_way}
    except (OSError, ValueError, KeyError, IndexError) as e:
        return {"error": f"baton_micro_bench: {e} (header_reads.log)"}


def step_result(path):
    """A step's JSON (its file's last line), or None where the step was not reached."""
    try:
        lines = open(path).read().strip().splitlines()
    except OSError:
        return None
    text = lines[-1] if lines else ""
    try:
        step = json.loads(text)
        if isinstance(step, dict):
            return step
    except ValueError:
        pass
    # A traceback or a partial line: kept as it came.
    return {"ok": False, "error": f"its last line is not a JSON object: {text[-500:]}"}


def torch_skipped(result, args):
    """The PyTorch steps that did not run on the GPU of a host where PyTorch has CUDA, by
    name, with why (the steps turned off on the command line excepted)."""
    skipped = {}
    torch = result.get("torch")
    if isinstance(torch, dict) and "skipped" in torch:
        skipped["torch"] = torch["skipped"]
    elif args.torch_unusable and result.get("gpu"):
        skipped["torch"] = f"its engines ran without PyTorch: {args.torch_unusable}"
    asked_off = set(filter(None, args.asked_off.split(",")))
    for name in STEPS:
        step = result.get(name)
        if isinstance(step, dict) and "skipped" in step and name not in asked_off:
            skipped[name] = step["skipped"]
    return skipped


def merge(args):
    try:
        result = json.load(open(args.driver))
    except ValueError as e:  # cut short as it wrote
        result = {"gpu": None, "ok": False, "error": f"the driver's JSON does not parse: {e}"}
    result["header_reads"] = header_reads(os.path.join(args.out, "header_reads.json"))
    failed = False
    for name in STEPS:
        step = step_result(os.path.join(args.out, f"{name}.json"))
        if step is None:
            continue
        result[name] = step
        if "skipped" not in step and not step.get("ok"):
            failed = True
    if args.torch_cuda:
        skipped = torch_skipped(result, args)
        if skipped:
            result["torch_skipped"] = {
                "error": "torch.cuda.is_available() is true on this host, yet these PyTorch "
                         "steps did not run on the GPU", "steps": skipped}
            failed = True
    if failed:
        result["ok"] = False
    path = os.path.join(args.out, "gpu_check.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)
    return 1 if failed else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--driver", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--torch-cuda", action="store_true")
    p.add_argument("--torch-unusable", default="")
    p.add_argument("--asked-off", default="")
    return merge(p.parse_args())


if __name__ == "__main__":
    sys.exit(main())
