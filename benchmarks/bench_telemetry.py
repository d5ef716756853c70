"""The cost of OpenTelemetry support per save and load (memory://, a growing 50-message state),
in one run, each variant in a process of its own, rounds interleaved:

- ``before``: the code before telemetry existed (``--old PATH``: a checkout, e.g.
  ``git archive 8650428 | tar -x -C /tmp/old``), opentelemetry absent;
- ``absent``: this code, opentelemetry not importable (the ``otel`` extra not installed);
- ``api, no sdk``: opentelemetry-api importable, no SDK installed (its proxy providers);
- ``sdk``: the SDK with an in-memory span exporter and metric reader.

    python benchmarks/bench_telemetry.py [--n 400] [--rounds 3] [--old /tmp/old]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import table  # noqa: E402

WORKER = r"""
import json, random, statistics, sys, time, uuid
mode, n = sys.argv[1], int(sys.argv[2])
if mode in ("absent", "before"):
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name == "opentelemetry" or name.startswith("opentelemetry."):
                raise ImportError("blocked")
    sys.meta_path.insert(0, Block())
if mode == "sdk":
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
elif mode == "api":
    import opentelemetry.trace  # importable, nothing installed
from cas_checkpoint import CheckpointStore
rng = random.Random(7)
msgs = [{"role": "user", "content": " ".join(str(rng.random()) for _ in range(20))}
        for _ in range(50 + n)]
url = f"memory://bench-{uuid.uuid4().hex[:8]}"
store = CheckpointStore.open(url)
saves, loads = [], []
for i in range(n):
    state = {"messages": msgs[i:i + 50], "step": i}
    t = time.perf_counter(); store.save("t", state); saves.append(time.perf_counter() - t)
    other = CheckpointStore.open(url)  # a cold load: a store object with empty caches
    t = time.perf_counter(); other.load("t"); loads.append(time.perf_counter() - t)
print(json.dumps({"save": statistics.median(saves), "load": statistics.median(loads)}))
"""

MODES = [("before", "before (no telemetry code)"), ("absent", "absent (no otel extra)"),
         ("api", "api, no sdk installed"), ("sdk", "sdk, in-memory exporter")]


def run(mode: str, n: int, path: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": path}
    out = subprocess.run([sys.executable, "-c", WORKER, mode, str(n)], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=400, help="saves (and cold loads) per process")
    ap.add_argument("--rounds", type=int, default=3, help="processes per variant (best kept)")
    ap.add_argument("--old", default=None, help="a checkout of the code before telemetry")
    args = ap.parse_args()
    here = str(Path(__file__).resolve().parent.parent)
    modes = [(m, label) for m, label in MODES if m != "before" or args.old]
    best: dict[str, dict[str, float]] = {}
    for _ in range(args.rounds):  # interleaved: a busy machine slows every variant alike
        for mode, _label in modes:
            got = run(mode, args.n, args.old if mode == "before" else here)
            was = best.setdefault(mode, got)
            best[mode] = {k: min(was[k], got[k]) for k in got}
    base = best[modes[0][0]]
    rows = [[label, f"{best[m]['save'] * 1e6:.0f}", f"{best[m]['save'] / base['save']:.2f}x",
             f"{best[m]['load'] * 1e6:.0f}", f"{best[m]['load'] / base['load']:.2f}x"]
            for m, label in modes]
    print(f"median per operation, memory://, 50 messages, n={args.n}, best of "
          f"{args.rounds} processes")
    print(table(["variant", "save us", "vs first", "cold load us", "vs first"], rows))


if __name__ == "__main__":
    main()
