#!/usr/bin/env python3
"""An outside scorer for prescale's plans, written from ../shared/REPLAY.md alone.

It shares no code with prescale (which is Rust): it parses the trace, replays a plan CSV
(`t_s,desired`) through the fleet model, computes the oracle's replica-seconds and the scenario
defaults, and runs the reactive reference policy, all as REPLAY.md words them. Arithmetic is
exact (`fractions.Fraction`: rates are read as the decimals they are written as), so the FIFO
delay rule can be applied literally (cumulative served against cumulative arrivals, with the
1e-9 tolerance) without floating-point drift. The e2e test `replay` compares prescale's summary
JSON with what this prints.

    rescore.py --trace FILE --plan plan.csv --capacity MU --warmup W --slo S [--interval 15]
               [--min-replicas N] [--max-replicas N] [--initial-replicas N]

Prints one JSON object: the scenario, the plan's score, the reactive policy's score and
`oracle_replica_seconds`. Readings where the text leaves a choice are marked "Reading:".
"""

import argparse
import csv
import datetime
import json
import math
import sys
from fractions import Fraction

TOL = Fraction(1, 10**9)


def parse_trace(path):
    """Return (a, T): a list of per-second arrival masses (Fractions) of length T."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header = [h.strip() for h in rows[0]]
    body = [r for r in rows[1:] if r and any(c.strip() for c in r)]
    if header[:3] == ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]:
        secs = []
        for r in body:
            ts = r[0].strip()
            whole = ts.split(".")[0]
            dt = datetime.datetime.strptime(whole, "%Y-%m-%d %H:%M:%S")
            # The fraction never changes the whole second: floor(ts - t0) with t0 the earliest
            # timestamp with its fraction dropped is this second minus t0's.
            secs.append(int(dt.replace(tzinfo=datetime.timezone.utc).timestamp()))
        t0 = min(secs)
        T = max(secs) - t0 + 1
        a = [Fraction(0)] * T
        for s in secs:
            a[s - t0] += 1
        return a, T
    if header[:2] == ["window_start_s", "rate_rps"]:
        starts = [Fraction(r[0].strip()) for r in body]
        rates = [Fraction(r[1].strip()) for r in body]
        width = starts[1] - starts[0]
        first = starts[0]
        T = int(starts[-1] + width - first)
        a = [Fraction(0)] * T
        # Reading: the window holding s is the last one starting at or before first + s.
        k = 0
        for s in range(T):
            while k + 1 < len(starts) and starts[k + 1] - first <= s:
                k += 1
            a[s] = rates[k]
        return a, T
    sys.exit(f"unknown trace header {header}")


def oracle(a, T, mu, W, slo, I, min_r):
    """The oracle's r_k per interval and its replica-seconds."""
    K = (T + I - 1) // I
    r = []
    B = Fraction(0)
    for k in range(K):
        sec = a[k * I : min(T, (k + 1) * I)]
        if B == 0 and all(x == 0 for x in sec):
            r.append(min_r)
            continue

        def ok(n):
            b = B
            for x in sec:
                b = max(Fraction(0), b + x - n * mu)
                if b > n * mu * slo:
                    return False
            return True

        lo = max(1, min_r)
        hi = max(lo, math.ceil((B + max(sec)) / mu))
        while not ok(hi):  # cannot happen (b stays 0 at hi), kept as a guard
            hi *= 2
        while lo < hi:
            mid = (lo + hi) // 2
            if ok(mid):
                hi = mid
            else:
                lo = mid + 1
        b = B
        for x in sec:
            b = max(Fraction(0), b + x - lo * mu)
        B = b
        r.append(lo)
    cost = 0
    for j in range(1, max(r, default=0) + 1):
        runs = []  # [start_s, end_s) of maximal runs of intervals with r_k >= j
        k = 0
        while k < K:
            if r[k] >= j:
                k0 = k
                while k < K and r[k] >= j:
                    k += 1
                runs.append([k0 * I, min(T, k * I)])
            else:
                k += 1
        merged = []
        for run in runs:
            if merged and run[0] - merged[-1][1] <= W:
                merged[-1][1] = run[1]
            else:
                merged.append(run)
        for s0, s1 in merged:
            cost += (s1 - s0) + (0 if s0 == 0 else W)
    return r, cost


class Reactive:
    """REPLAY.md's reactive reference policy."""

    def __init__(self, mu, slo, I):
        self.mu, self.slo, self.I = mu, slo, I
        self.last_active = 0  # Reading: inactivity counts from the start of the trace.
        self.kept = []

    def decide(self, s, a, backlog, ready, warming):
        mu = self.mu
        rate = sum(a[max(0, s - 60) : s]) / 60
        q = backlog[s - 1] if s > 0 else Fraction(0)
        if rate > ready * mu and ready > 0:
            util = math.ceil(Fraction(ready) / Fraction(8, 10))
        else:
            util = math.ceil(min(rate, ready * mu) / (Fraction(8, 10) * mu))
        queue = math.ceil(q / (mu * self.slo))
        raw = max(util, queue)
        active = q > 0 or any(x > 0 for x in a[max(0, s - self.I) : s])
        if active:
            self.last_active = s
        current = ready + warming
        if current == 0:
            return max(1, raw) if active else 0
        if s - self.last_active >= 300:
            self.kept = []
            return 0
        raw = min(max(raw, 1), max(2 * current, current + 4))
        self.kept.append((s, raw))
        # Reading: "the last 300 s" keeps decisions at s' > s - 300.
        self.kept = [(t, x) for (t, x) in self.kept if t > s - 300]
        return raw if raw >= current else max(x for _, x in self.kept)


def simulate(a, T, mu, W, slo, I, min_r, max_r, initial, decide):
    """Run the fleet model; `decide(s, a, backlog, ready, warming)` answers at decision times."""
    ready = initial
    warming = []  # ready seconds, in start order (newest last)
    backlog = []
    b = Fraction(0)
    cost = 0
    starts = 0
    served_cum = []
    sc = Fraction(0)
    for s in range(T):
        if s % I == 0:
            d = min(max(decide(s, a, backlog, ready, len(warming)), min_r), max_r)
            n = ready + len(warming)
            if d > n:
                warming.extend([s + W] * (d - n))
                starts += d - n
            elif d < n:
                drop = n - d
                w = min(drop, len(warming))
                if w:
                    del warming[len(warming) - w :]
                ready -= drop - w
        now_ready = sum(1 for t in warming if t <= s)
        if now_ready:
            warming = [t for t in warming if t > s]
            ready += now_ready
        cost += ready + len(warming)
        served = min(b + a[s], ready * mu)
        b = b + a[s] - served
        backlog.append(b)
        sc += served
        served_cum.append(sc)
    # FIFO delays, the literal rule: the mass of second s0 is done at the first t >= s0 with
    # cumulative served >= cumulative arrivals through s0 (tolerance 1e-9).
    total = sum(a)
    A = Fraction(0)
    t = 0
    delays = []  # (delay or None for never, mass)
    for s0 in range(T):
        A += a[s0]
        if a[s0] == 0:
            continue
        t = max(t, s0)
        while t < T and served_cum[t] < A - TOL:
            t += 1
        delays.append((t - s0 if t < T else None, a[s0]))
    ok = sum(m for d, m in delays if d is not None and d <= slo)
    att = ok / total if total > 0 else Fraction(1)

    def quantile(p):
        if total == 0:
            return 0
        acc = Fraction(0)
        for d, m in sorted(((d, m) for d, m in delays if d is not None), key=lambda x: x[0]):
            acc += m
            if acc >= p * total:
                return d
        return None  # never reached: infinite (JSON null)

    return {
        "slo_attainment": float(att),
        "replica_seconds": cost,
        "p50_delay_s": quantile(Fraction(1, 2)),
        "p99_delay_s": quantile(Fraction(99, 100)),
        "replica_starts": starts,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--plan", required=True)
    ap.add_argument("--capacity", required=True)
    ap.add_argument("--warmup", type=int, required=True)
    ap.add_argument("--slo", required=True)
    ap.add_argument("--interval", type=int, default=15)
    ap.add_argument("--min-replicas", type=int, default=0)
    ap.add_argument("--max-replicas", type=int)
    ap.add_argument("--initial-replicas", type=int)
    o = ap.parse_args()
    mu, slo, W, I = Fraction(o.capacity), Fraction(o.slo), o.warmup, o.interval
    a, T = parse_trace(o.trace)
    r, oracle_cost = oracle(a, T, mu, W, slo, I, o.min_replicas)
    initial = o.initial_replicas
    if initial is None:
        initial = max(r[: W // I + 2], default=0)  # Reading: W/I is integer division.
    max_r = o.max_replicas if o.max_replicas is not None else max(2 * max(r, default=0), 2)

    plan = {}
    with open(o.plan, newline="") as f:
        rows = list(csv.reader(f))
    if [h.strip() for h in rows[0][:2]] != ["t_s", "desired"]:
        sys.exit(f"plan header {rows[0]}")
    for row in rows[1:]:
        if row:
            plan[int(row[0])] = int(row[1])
    expected = list(range(0, T, I))
    if sorted(plan) != expected:
        sys.exit(f"plan rows {len(plan)} do not cover the {len(expected)} decision times")

    scored = simulate(a, T, mu, W, slo, I, o.min_replicas, max_r, initial, lambda s, *_: plan[s])
    reactive = Reactive(mu, slo, I)
    react = simulate(a, T, mu, W, slo, I, o.min_replicas, max_r, initial, reactive.decide)
    print(
        json.dumps(
            {
                "trace_seconds": T,
                "initial_replicas": initial,
                "max_replicas": max_r,
                "plan": scored,
                "reactive": react,
                "oracle_replica_seconds": oracle_cost,
            }
        )
    )


if __name__ == "__main__":
    main()
