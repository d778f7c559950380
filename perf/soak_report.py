"""perf/soak's judgement of its samples: the daemons' resource growth and the machine's load.

A sample is (monotonic time, "load_average", value) or (monotonic time, role, RSS in KiB,
open fds, pid, start time, steady) for a daemon (role "controller", "router" or "keeper"),
`steady` when the pair was whole and alone as it was taken (soak_stack.steady).
"""
import collections
import os
import statistics

# RSS (the median of a window) and fds (the fewest in a window: connections come and go with
# the load, a leak raises the floor) may grow by this much between the first and the last
# window; fds also by two requests' connections (a client's and an engine's each).
GROWTH_LIMIT_PERCENT = 5.0
FD_SLACK = 4
NOT_JUDGED = "not judged"


def instances(samples, role):
    """The samples of `role` by process: {(pid, start time): samples in time order}. Faults
    restart the daemons (a router restart, a controller killed or hung, a keeper killed), so
    one role's samples come from several processes."""
    out = collections.defaultdict(list)
    for s in samples:
        if s[1] == role:
            out[(s[4], s[5])].append(s)
    return out


def growth(first, last, slack):
    g = 100.0 * (last - first) / first if first else 0.0
    return {"first": first, "last": last, "growth_percent": round(g, 2),
            "bounded": g < GROWTH_LIMIT_PERCENT or last - first <= slack}


def judge(mine, window, slack_fds):
    """The first and the last `window` of one process's own life, `mine` (its samples): the
    median RSS and the fewest fds of each, and whether they grew within bounds. The fds are
    those of the steady samples when both windows have some: an engine fewer (a failover's
    gap) or more (a canary) moves the controller's fds by a few, which is no leak."""
    first = [s for s in mine if s[0] < mine[0][0] + window]
    last = [s for s in mine if s[0] >= mine[-1][0] - window]
    first_fds, last_fds = steady_ones(first), steady_ones(last)
    if not first_fds or not last_fds:
        first_fds, last_fds = first, last
    return {"rss_kib": growth(statistics.median(s[2] for s in first),
                              statistics.median(s[2] for s in last), 0),
            "fds": growth(min(s[3] for s in first_fds), min(s[3] for s in last_fds),
                          FD_SLACK + slack_fds)}


def steady_ones(samples):
    return [s for s in samples if len(s) > 6 and s[6]]


def resources(samples, window, pooled=0):
    """Per daemon, its longest-lived process judged over the first and the last `window` of
    its own life (judge()): a restarted daemon's windows would otherwise compare two
    processes. `verdict` is "bounded", "grew", or "not judged" when no process of it lived two
    windows; `pid`, `lived_s` and `instances` say which process was judged and among how many.
    The router may also keep `pooled` more fds: an idle keep-alive connection per request it
    had in flight at once lives up to 30 s (docs/router.md), so a burst of replays after a
    fault raises the next 30 s' floor; a leak grows past any bound."""
    out = {}
    for role in sorted({s[1] for s in samples} - {"load_average"}):
        lives = instances(samples, role)
        (pid, _), mine = max(lives.items(), key=lambda kv: kv[1][-1][0] - kv[1][0][0])
        lived = mine[-1][0] - mine[0][0]
        r = {"pid": pid, "lived_s": round(lived, 1), "instances": len(lives)}
        if lived < 2 * window:
            r["verdict"] = NOT_JUDGED
        else:
            r.update(judge(mine, window, pooled if role == "router" else 0))
            bounded = r["rss_kib"]["bounded"] and r["fds"]["bounded"]
            r["verdict"] = "bounded" if bounded else "grew"
        out[role] = r
    return out


def resources_bounded(res):
    """True when every daemon judged stayed bounded, False when one grew, "not judged" when
    no daemon lived long enough to be judged."""
    verdicts = {r["verdict"] for r in res.values()} - {NOT_JUDGED}
    if not verdicts:
        return NOT_JUDGED
    return verdicts == {"bounded"}


def load_average(samples):
    """The machine's 1-minute load average over the run: a loaded machine starves the
    heartbeats and the controller's loop, and its failovers come from that, not the faults."""
    values = [s[2] for s in samples if s[1] == "load_average"]
    if not values:
        return None
    return {"median": round(statistics.median(values), 2), "max": round(max(values), 2),
            "cpus": os.cpu_count()}
