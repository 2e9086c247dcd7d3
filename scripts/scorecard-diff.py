#!/usr/bin/env python3
"""Compare two scorecard batteries (scripts/scorecard-sets.sh) scenario by scenario.

    scripts/scorecard-diff.py BEFORE_DIR AFTER_DIR

For every set logged in both directories, prints each scenario whose prescale attainment or
GPU-hours changed (variants too, from the dev log's per-scenario lines), marks a scenario that
starts or stops passing rule 1 (attainment ≥ reactive's and GPU-hours ≤ reactive's) as NEWLOSS
or NEWWIN, prints the rule-2 lines that changed, and ends with the count of rule-1 losses
over every set before and after (variant scenarios included). Exits 1 when any scenario is a
NEWLOSS, 2 when a log holds no scenario rows (a crashed run or a changed table).
"""

import glob
import os
import re
import signal
import sys

EPS = 1e-9

ROW = re.compile(
    r"^(\S+)\s+(\d+) \|\s+([\d.]+)\s+([\d.]+)\s+[\d.]+\s+\d+\s+[\d.]+ \|\s+([\d.]+)\s+([\d.]+)"
    r".*\|\s+(pass|FAIL)\s+\S+\s*$"
)
VARIANT = re.compile(
    r"^\s+(\S+) (\S+)\s+W=(\d+)\s*: pre\s+([\d.]+)%\s+([\d.]+) GPUh \| rea\s+([\d.]+)%\s+([\d.]+) GPUh"
)
VARIANT_SUMMARY = re.compile(r"^variant (\S+): rule 1")
VARIANT_FAIL = re.compile(r"^\s+rule 1 fails: (\S+) W=(\d+):")


def parse(path):
    """Per scenario (scenario, W): (pre att %, pre GPU-h, reactive att %, reactive GPU-h, rule 1
    passed), and the rule-2 lines.

    Rule 1 is read from the scorecard's own verdict (the R1 column, and a variant's "rule 1
    fails" lines), not recomputed: a variant's per-scenario GPU-hours are printed to 0.1, and a
    cost loss by less than that would look like a tie.
    """
    rows, rules, failed = {}, [], set()
    label = None
    with open(path) as f:
        for line in f:
            m = ROW.match(line)
            if m:
                vals = tuple(float(m.group(i)) for i in (3, 4, 5, 6))
                # A set may replay one trace at several settings (`alt`: other capacities and
                # SLOs); the second row of the same trace and W is "trace#2", and so on.
                key = (m.group(1), int(m.group(2)))
                k = 1
                while key in rows:
                    k += 1
                    key = (f"{m.group(1)}#{k}", int(m.group(2)))
                rows[key] = vals + (m.group(7) == "pass",)
                continue
            m = VARIANT.match(line)
            if m:
                key = (m.group(1) + ":" + m.group(2), int(m.group(3)))
                rows[key] = tuple(float(m.group(i)) for i in (4, 5, 6, 7)) + (True,)
                continue
            m = VARIANT_SUMMARY.match(line)
            if m:
                label = m.group(1)
            m = VARIANT_FAIL.match(line)
            if m and label:
                failed.add((label + ":" + m.group(1), int(m.group(2))))
            if line.startswith(("rule 2", "variant")):
                rules.append(line.strip())
    for key in failed:
        if key in rows:
            rows[key] = rows[key][:4] + (False,)
    return rows, rules


def passes(r):
    return r[4]


def main():
    # Piped into `head`: stop quietly.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    if len(sys.argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    before, after = sys.argv[1], sys.argv[2]
    new_losses = new_wins = 0
    lost_before = lost_after = 0
    for fa in sorted(glob.glob(os.path.join(before, "*.log"))):
        name = os.path.basename(fa)[:-4]
        if name == "build":
            continue
        fb = os.path.join(after, name + ".log")
        if not os.path.exists(fb):
            continue
        (ra, la), (rb, lb) = parse(fa), parse(fb)
        # A run that crashed, or a scorecard whose table changed shape, parses to nothing:
        # that is not "no change".
        for path, rows in ((fa, ra), (fb, rb)):
            if not rows:
                print(f"scorecard-diff: no scenario rows in {path}", file=sys.stderr)
                return 2
        lost_before += sum(1 for k in ra if k in rb and not passes(ra[k]))
        lost_after += sum(1 for k in rb if k in ra and not passes(rb[k]))
        for key in sorted(ra):
            if key not in rb:
                continue
            a, b = ra[key], rb[key]
            if abs(a[0] - b[0]) < EPS and abs(a[1] - b[1]) < EPS:
                continue
            flag = ""
            if passes(a) and not passes(b):
                flag, new_losses = "NEWLOSS", new_losses + 1
            elif passes(b) and not passes(a):
                flag, new_wins = "NEWWIN", new_wins + 1
            gpu = 100.0 * (b[1] - a[1]) / max(a[1], EPS)
            print(
                f"{name:10} {key[0]:42} W={key[1]:<3} att {a[0]:8.3f} -> {b[0]:8.3f} ({b[0] - a[0]:+7.3f})"
                f"  GPUh {a[1]:9.2f} -> {b[1]:9.2f} ({gpu:+6.2f}%)  reactive {b[2]:.3f} % {b[3]:.1f} {flag}"
            )
        for x, y in zip(la, lb):
            if x != y:
                print(f"{name:10} before: {x}\n{name:10} after:  {y}")
    print(
        f"rule-1 losses over every set: {lost_before} -> {lost_after}"
        f" ({new_losses} new, {new_wins} no longer)"
    )
    return 1 if new_losses else 0


if __name__ == "__main__":
    sys.exit(main())
