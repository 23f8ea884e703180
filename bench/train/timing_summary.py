#!/usr/bin/env python3
# Where a data-parallel step's all-reduce time goes, from the node logs that
# `MESH_TRAIN_TIMING=1 MESH_BENCH_KEEP=DIR mesh-bench-finetune ...` keeps (docs/training.md, "The
# host path today"): python3 bench/train/timing_summary.py DIR [DIR ...]
# Over every node's log of a run (nodes of one host: one steady clock), steps 4..8: per bucket,
# the reduction once the last member had its bucket on the host (latest "all-reduce starts" to
# the latest "all-reduce done"), and per step the time from the last member's last bucket on the
# host to the coordinator's "every member reduced"; the step from one "every member reduced" to the
# next, and the last "sum written" of any member after its step's "every member reduced".
import re, sys, glob, statistics as st
for d in sys.argv[1:]:
    ev = {}  # (step, what) -> [times over nodes]
    for f in sorted(glob.glob(d + "/*.log")):
        seen = set()
        for line in open(f, errors="replace"):
            m = re.search(r"train timing: ([\d.]+) step (\d+) (worker|coordinator): (.*)$", line)
            if not m: continue
            key = (int(m.group(2)), m.group(3) + ": " + m.group(4).strip())
            if key in seen: continue  # the first of each per node
            seen.add(key)
            ev.setdefault(key, []).append(float(m.group(1)))
    red, tail, step, written = [], [], [], []
    for s in range(4, 9):
        fin, nxt = ev.get((s, "coordinator: every member reduced")), ev.get((s + 1, "coordinator: every member reduced"))
        if fin and nxt: step.append(nxt[0] - fin[0])
        wrote = [max(v) for (st_, k), v in ev.items() if st_ == s and re.match(r"worker: bucket \d+ sum written$", k)]
        if fin and wrote: written.append(max(wrote) - fin[0])
        for b in range(64):
            a, z = ev.get((s, f"worker: bucket {b} all-reduce starts")), ev.get((s, f"worker: bucket {b} all-reduce done"))
            if a and z: red.append(max(z) - max(a))
        last = [max(v) for (st_, k), v in ev.items() if st_ == s and re.match(r"worker: bucket \d+ done$", k)]
        fin = ev.get((s, "coordinator: every member reduced"))
        if last and fin: tail.append(fin[0] - max(last))
    q = lambda v: f"median {st.median(v):.1f} ms, max {max(v):.1f} (n={len(v)})" if v else "none"
    print(d, "\n  bucket reduced after the last member's bucket is on the host:", q(red),
          "\n  step reduced after the last bucket is on the host:", q(tail),
          "\n  step (every member reduced to the next):", q(step),
          "\n  last sum written after every member reduced:", q(written))
