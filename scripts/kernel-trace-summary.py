#!/usr/bin/env python3
"""Attributes the time of a CUDA graph's replays to its kernels, from a bench/kernel_trace.cpp CSV.

Usage: scripts/kernel-trace-summary.py trace.csv [--graph ID]

Takes the graph with the most kernel records (or --graph), cuts its records into replays (its distinct
nodes per replay, in start order), and prints per replay: the wall time (first start to last end) and the
sum of kernel durations; per kernel class (name and grid, in the order of the first replay): launches
per replay, median duration, median gap between the previous kernel's end and this one's start
(negative: they overlapped, as programmatic dependent launch allows) and the time the kernel adds to the
replay's critical path, i.e. how far its end moves the latest end seen so far (these add up to the wall
time less the first kernel's start). Times in microseconds.
"""
import argparse
import csv
import statistics
from collections import defaultdict


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--graph", type=int, default=None)
    a = ap.parse_args()
    rows = []
    with open(a.trace) as f:
        for r in csv.DictReader(f):
            rows.append((int(r["start_ns"]), int(r["end_ns"]), int(r["graph_id"]), int(r["graph_node_id"]),
                         int(r["grid_x"]), int(r["block_x"]), r["name"]))
    by_graph = defaultdict(list)
    for r in rows:
        if r[2]:
            by_graph[r[2]].append(r)
    if not by_graph:
        raise SystemExit(f"{a.trace}: no kernels launched from CUDA graphs")
    g = a.graph if a.graph is not None else max(by_graph, key=lambda k: len(by_graph[k]))
    recs = sorted(by_graph[g])
    nodes = len({r[3] for r in recs})
    replays = [recs[i:i + nodes] for i in range(0, len(recs) - nodes + 1, nodes)]
    walls, busy = [], []
    cls_order, cls = [], defaultdict(lambda: {"n": 0, "dur": [], "gap": [], "crit": []})
    for rep in replays:
        t0, latest, prev_end = rep[0][0], rep[0][0], None
        per_rep = defaultdict(lambda: [0, 0.0, 0.0, 0.0])
        for (s, e, _, _, gx, bx, name) in rep:
            key = f"{name} <{gx}x{bx}>"
            if key not in cls:
                cls_order.append(key)
            c = per_rep[key]
            c[0] += 1
            c[1] += (e - s) / 1e3
            c[2] += ((s - prev_end) / 1e3) if prev_end is not None else 0.0
            c[3] += max(0, e - latest) / 1e3
            latest = max(latest, e)
            prev_end = e
            cls[key]  # create
        for key, (n, d, gp, cr) in per_rep.items():
            c = cls[key]
            c["n"] = n
            c["dur"].append(d / n)
            c["gap"].append(gp / n)
            c["crit"].append(cr)
        walls.append((max(r[1] for r in rep) - t0) / 1e3)
        busy.append(sum(r[1] - r[0] for r in rep) / 1e3)
    med = statistics.median
    print(f"graph {g}: {len(replays)} replays of {nodes} kernels; wall per replay median {med(walls):.1f} us "
          f"(min {min(walls):.1f}), kernel durations summed {med(busy):.1f} us")
    print(f"{'kernel <grid x block>':64} {'per replay':>10} {'dur us':>8} {'gap us':>8} {'crit us/replay':>15} {'share':>6}")
    total = sum(med(cls[k]["crit"]) for k in cls_order) or 1.0
    for k in sorted(cls_order, key=lambda k: -med(cls[k]["crit"])):
        c = cls[k]
        cr = med(c["crit"])
        print(f"{k[:64]:64} {c['n']:>10} {med(c['dur']):>8.2f} {med(c['gap']):>8.2f} {cr:>15.1f} {100 * cr / total:>5.1f}%")


if __name__ == "__main__":
    main()
