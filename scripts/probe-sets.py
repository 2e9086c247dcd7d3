#!/usr/bin/env python3
"""Held-out probe sets for the planner scorecard, as `PRESCALE_TRACE_SET` strings.

A planner change is judged on traces it was not developed on, not on the dev figures alone
(ARCHITECTURE.md, "Where this differs"). This prints the scorecard's trace-set spec for one
probe set; the derived sets are written under OUT_DIR (default `target/probes`):

    coarse    the dev rate series averaged to 30- and 60-minute windows (24 scenarios)
    fine      the dev rate series at 1- and 5-minute windows, each window's value linearly
              interpolated between window centres (a smooth ramp; 24 scenarios)
    noisy     the dev rate series as Poisson counts per 1- and 5-minute window: what a
              Prometheus export of the real request stream at that step looks like (a grid
              finer than W with noise on every window; 24 scenarios)
    alt       the dev traces at capacities and SLOs other than their README's (21 scenarios)
    servegen  four more ServeGen m-large clients (forecaster/benches/heldout/, 18 scenarios)
    servegen2 seven more, every 20th client from 20 to 140 (21 scenarios)
    servegen3 seven more, every 20th client from 30 to 150 (21 scenarios)
    servegen4 seven more: clients 10, 25, 45, 65, 85, 105, 125 (21 scenarios)
    conv      Azure's 2023 conversation log at six capacity/SLO settings (18 scenarios)

    PRESCALE_TRACE_SET=$(scripts/probe-sets.py fine) \\
        cargo bench -p prescale-forecaster --bench scorecard

`--list` prints the sets' names (what scripts/scorecard-sets.sh runs by default).

Capacities follow the dev traces' README: 25 req/s for the 14-day aggregate, 0.5 for the
single clients, 0.25 for the scale-to-zero one; SLO 5 s.
"""

import argparse
import csv
import os
import math
import random
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEV = os.path.normpath(os.path.join(ROOT, "..", "shared", "traces"))
HELDOUT = os.path.join(ROOT, "forecaster", "benches", "heldout")

# (dev rate series, capacity) for the derived sets.
SERIES = [
    ("servegen-m-large-14d", 25),
    ("servegen-m-large-chunk-144", 0.5),
    ("servegen-m-large-chunk-32", 0.5),
    ("servegen-m-large-chunk-93", 0.25),
]


def read_rates(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))[1:]
    return [(float(t), float(r)) for t, r in rows]


def write_rates(path, rows):
    with open(path, "w") as f:
        f.write("window_start_s,rate_rps\n")
        for t, r in rows:
            f.write(f"{int(t)},{r:.6f}\n")


def derived(out, tag, params, windows):
    """One file per dev series and parameter `k`: `windows(name, rows, k)` turns the series'
    `(start, rate)` rows into new ones, written as `{name}-{tag}{k}.csv`; returns the spec."""
    spec = []
    for name, cap in SERIES:
        rows = read_rates(os.path.join(DEV, name + ".csv"))
        for k in params:
            path = os.path.join(out, f"{name}-{tag}{k}.csv")
            write_rates(path, windows(name, rows, k))
            spec.append(f"{path}:{cap}:5")
    return spec


def coarse(out):
    # k consecutive windows averaged into one.
    def windows(_name, rows, k):
        return [(rows[i][0], sum(r for _, r in rows[i : i + k]) / k) for i in range(0, len(rows) - k + 1, k)]

    return derived(out, "c", (3, 6), windows)


def fine(out):
    def windows(_name, rows, step):
        width = rows[1][0] - rows[0][0]
        sub = []
        for i, (t0, r0) in enumerate(rows):
            before = rows[i - 1][1] if i > 0 else r0
            after = rows[i + 1][1] if i + 1 < len(rows) else r0
            for j in range(0, int(width), step):
                # The rate at the sub-window's centre, on the line between window centres.
                x = (j + step / 2) / width
                v = before + (r0 - before) * (x + 0.5) if x < 0.5 else r0 + (after - r0) * (x - 0.5)
                sub.append((t0 + j, max(v, 0.0)))
        return sub

    return derived(out, "f", (60, 300), windows)


def poisson(rng, lam):
    """A Poisson draw (Knuth's product of uniforms below 30, a rounded normal above)."""
    if lam <= 0:
        return 0
    if lam < 30:
        limit, k, p = math.exp(-lam), 0, 1.0
        while True:
            p *= rng.random()
            if p <= limit:
                return k
            k += 1
    return max(0, round(rng.gauss(lam, math.sqrt(lam))))


def noisy(out):
    def windows(name, rows, step):
        width = rows[1][0] - rows[0][0]
        # A fixed seed per file: the same set on every machine (Python's generator is
        # stable across versions for random() and gauss()).
        rng = random.Random(f"{name}-p{step}")
        return [(t0 + j, poisson(rng, r * step) / step) for t0, r in rows for j in range(0, int(width), step)]

    return derived(out, "p", (60, 300), windows)


def alt(_out):
    d = DEV
    return [
        f"{d}/servegen-m-large-14d.csv:50:5",
        f"{d}/servegen-m-large-14d.csv:10:5",
        f"{d}/servegen-m-large-chunk-144.csv:1:5",
        f"{d}/servegen-m-large-chunk-32.csv:1:10",
        f"{d}/servegen-m-large-chunk-93.csv:0.5:5",
        f"{d}/azure-llm-2023-code.csv:0.25:10",
        f"{d}/azure-llm-2023-code.csv:1:5",
    ]


def servegen(_out):
    h = HELDOUT
    return [
        f"{h}/servegen-m-large-chunk-0.csv:0.5:5",
        f"{h}/servegen-m-large-chunk-1.csv:0.25:5",
        f"{h}/servegen-m-large-chunk-15.csv:0.5:5",
        f"{h}/servegen-m-large-chunk-161.csv:0.25:5",
        f"{h}/servegen-m-large-chunk-15.csv:1:5",
        f"{h}/servegen-m-large-chunk-0.csv:1:10",
    ]


def clients(caps):
    """Held-out ServeGen clients `{chunk: capacity}` at SLO 5 s: capacity 0.5 req/s, 0.25 where
    three quarters of the windows are idle."""
    return [f"{HELDOUT}/servegen-m-large-chunk-{n}.csv:{cap}:5" for n, cap in caps.items()]


def servegen2(_out):
    # Seven more clients, every 20th chunk from 20 to 140 (picked by number, not by behaviour).
    return clients({20: 0.5, 40: 0.25, 60: 0.25, 80: 0.5, 100: 0.5, 120: 0.5, 140: 0.5})


def servegen3(_out):
    # Seven more, every 20th chunk from 30 to 150 (session 25; picked by number before any was
    # replayed).
    return clients({30: 0.25, 50: 0.25, 70: 0.25, 90: 0.25, 110: 0.5, 130: 0.25, 150: 0.25})


def servegen4(_out):
    # Seven more (session 25, after the session's planner changes were made: a clean check of
    # them): chunks 10, 25, 45, 65, 85, 105, 125, picked by number before any was replayed.
    return clients({10: 0.5, 25: 0.5, 45: 0.5, 65: 0.25, 85: 0.25, 105: 0.25, 125: 0.25})


def conv(_out):
    c = f"{HELDOUT}/azure-llm-2023-conv.csv"
    return [f"{c}:{cap}:{slo}" for cap, slo in ((0.25, 5), (0.5, 5), (1, 5), (2, 5), (1, 10), (1, 2))]


SETS = {
    "coarse": coarse,
    "fine": fine,
    "noisy": noisy,
    "alt": alt,
    "servegen": servegen,
    "servegen2": servegen2,
    "servegen3": servegen3,
    "servegen4": servegen4,
    "conv": conv,
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("set", nargs="?", choices=sorted(SETS))
    ap.add_argument("--out", default=os.path.join(ROOT, "target", "probes"), help="where derived traces go")
    ap.add_argument("--list", action="store_true", help="print the names of the sets, in order, and exit")
    a = ap.parse_args()
    if a.list:
        print(" ".join(SETS))
        return
    if a.set is None:
        ap.error("a probe set is required (or --list)")
    if not os.path.isdir(DEV):
        sys.exit(f"probe-sets: the dev traces are not at {DEV}")
    os.makedirs(a.out, exist_ok=True)
    print(",".join(SETS[a.set](a.out)))


if __name__ == "__main__":
    main()
