#!/usr/bin/env python3
"""The reference of bench_allreduce: one rank of a torch.distributed all-reduce on Gloo.

bench_allreduce starts `--world` of these (in the same network namespaces and on the same
addresses as its own ranks) and reads stdout:

    iter K START_NS END_NS CPU_NS   per timed iteration: CLOCK_MONOTONIC (as the bench's) and
                                    this process's CPU time (user + system) during it
    check ok | check bad ...  every iteration's result compared with the expected sum
    unsupported WHY           this torch's Gloo cannot all-reduce the dtype (no figure, no failure)

The input is the bench's pattern: rank r's element i in round k is ((7i + 13r + 5k) mod 31) - 15,
so every sum is an exact integer in float32 and bfloat16 alike, and is checked for equality.
The exit status is non-zero when a result is wrong or anything fails.
"""
import argparse
import datetime
import resource
import sys
import time

try:
    import torch
    import torch.distributed as dist
except ImportError as e:  # the bench checks first; this is for a direct run
    print(f"unsupported torch is not importable: {e}", flush=True)
    sys.exit(4)


def cpu_ns() -> int:
    """CPU time (user + system, all threads, Gloo's included) of this process so far."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return int((ru.ru_utime + ru.ru_stime) * 1e9)


def pattern(elems: int, rank: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    i = torch.arange(elems, dtype=torch.int64)
    return ((7 * i + 13 * rank + 5 * k) % 31 - 15).to(dtype)


def expected_sum(elems: int, world: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    i = torch.arange(elems, dtype=torch.int64)
    total = torch.zeros(elems, dtype=torch.int64)
    for r in range(world):
        total += (7 * i + 13 * r + 5 * k) % 31 - 15
    return total.to(dtype)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--init", required=True, help="tcp://HOST:PORT of rank 0")
    p.add_argument("--mib", type=float, default=64, help="buffer size as float32 MiB (the element count)")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--dtype", choices=["f32", "bf16", "f16"], default="f32")
    a = p.parse_args()
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[a.dtype]
    elems = int(a.mib * (1 << 20) / 4)  # same element count as the bench, whatever the dtype

    # One compute thread: the bench's ranks share the machine's cores with these.
    torch.set_num_threads(1)
    # A bounded timeout: a rank that stops (a wrong result) must not hold the others for 30 min.
    dist.init_process_group("gloo", init_method=a.init, rank=a.rank, world_size=a.world,
                            timeout=datetime.timedelta(seconds=120))
    ok = True
    timed = []
    for k in range(a.warmup + a.iters):
        x = pattern(elems, a.rank, k, dtype)
        dist.barrier()  # all ranks start together, as the bench's "go"
        t0 = time.monotonic_ns()
        c0 = cpu_ns()
        try:
            dist.all_reduce(x)
        except RuntimeError as e:
            # Only the dtype refusal is "no figure"; any other failure is a failure.
            if k == 0 and "scalar type" in str(e):
                print(f"unsupported {a.dtype}: {str(e).splitlines()[0]}", flush=True)
                return 0
            raise
        t1 = time.monotonic_ns()
        c1 = cpu_ns()
        if k >= a.warmup:
            timed.append((k - a.warmup, t0, t1, c1 - c0))
        want = expected_sum(elems, a.world, k, dtype)
        if not torch.equal(x, want):
            bad = int((x != want).nonzero()[0])
            print(f"check bad round {k} element {bad} is {float(x[bad])}, expected {float(want[bad])}", flush=True)
            ok = False
            break
    for k, t0, t1, cpu in timed:
        print(f"iter {k} {t0} {t1} {cpu}")
    if ok:
        print("check ok")
    sys.stdout.flush()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
