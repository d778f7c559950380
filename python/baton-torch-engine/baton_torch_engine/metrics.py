"""The torch engine's GET /metrics, in Prometheus text: its HTTP responses by status, its
scheduler's counters and gauges, and the KV-warm failover's series, named as the reference
engine's (baton_engine_*)."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .server import State


def metrics_text(s: State) -> str:
    """The text GET /metrics answers, read from the state, its generator's scheduler and its
    KV handoff (zeros and no KV series before there are any)."""
    g = s.generator
    lines = ["# HELP baton_engine_http_responses_total HTTP responses sent, by status code.",
             "# TYPE baton_engine_http_responses_total counter"]
    with s.lock:
        for code, n in sorted(s.responses.items()):
            lines.append(f'baton_engine_http_responses_total{{code="{code}"}} {n}')
        running = s.in_flight
    sch = g.scheduler if g else None
    invariant = bool(g and g.model.batch_invariant)
    for name, kind, text, value in [
            ("prompt_tokens_total", "counter", "Prompt tokens of admitted requests.",
             sch.prompt_total if sch else 0),
            ("generated_tokens_total", "counter", "Tokens generated.",
             sch.generated_total if sch else 0),
            ("running_requests", "gauge", "Requests being answered.", running),
            ("batch_sequences", "gauge", "Sequences in the compute thread's batch.",
             len(sch.running) if sch else 0),
            ("waiting_requests", "gauge", "Requests waiting for room in the batch.",
             len(sch.waiting) if sch else 0),
            ("steps_total", "counter", "Batched forward steps computed.",
             sch.steps_total if sch else 0),
            ("preemptions_total", "counter",
             "Sequences preempted for recompute when the KV cache was full.",
             sch.preempted_total if sch else 0),
            ("batch_invariant", "gauge",
             "1 when a row's logits do not depend on the batch it is computed in.",
             int(invariant)),
            ("serving", "gauge", "1 while the engine serves, 0 while it stands by.",
             1 if s.serving and not s.stopping else 0)]:
        lines += [f"# HELP baton_engine_{name} {text}", f"# TYPE baton_engine_{name} {kind}",
                  f"baton_engine_{name} {value}"]
    lines += ["# HELP baton_engine_resumed_requests_total Replays admitted "
              "(baton_resume_tokens > 0); batch_invariant=\"false\": their continuation may "
              "differ from the interrupted run's.",
              "# TYPE baton_engine_resumed_requests_total counter",
              f'baton_engine_resumed_requests_total{{batch_invariant="{str(invariant).lower()}"}} '
              f"{sch.resumed_total if sch else 0}"]
    lines += kv_metrics(s.handoff)
    return "\n".join(lines) + "\n"


def kv_metrics(handoff) -> list[str]:
    """The KV-warm failover's series, named as the reference engine's (none without one)."""
    if handoff is None:
        return []
    c = handoff.counters
    out: list[str] = []
    for name, kind, text, series in [
            ("kv_adopted_sequences_total", "counter",
             "Sequences adopted from a predecessor's KV records.", {"": c.adopted}),
            ("kv_dropped_sequences_total", "counter",
             "A predecessor's sequences not adopted, by reason.",
             {f'{{reason="{r}"}}': n for r, n in sorted(c.dropped.items())}),
            ("kv_continued_requests_total", "counter",
             "Requests that continued from adopted KV.", {"": c.continued}),
            ("kv_tokens_not_recomputed_total", "counter",
             "Tokens whose K and V came from adopted KV instead of a prefill.",
             {"": c.tokens_not_recomputed}),
            ("kv_kept_freed_total", "counter", "Adopted KV freed unclaimed, by reason.",
             {f'{{reason="{r}"}}': n for r, n in sorted(c.kept_freed.items())}),
            ("kv_kept_sequences", "gauge", "Adopted sequences waiting for their request.",
             {"": len(handoff.kept)}),
            ("kv_handed_over_sequences_total", "counter",
             "Running sequences handed over to the next primary by a switch-over.",
             {"": c.handed_over})]:
        out += [f"# HELP baton_engine_{name} {text}", f"# TYPE baton_engine_{name} {kind}"]
        out += [f"baton_engine_{name}{labels} {v}" for labels, v in series.items()]
    return out
