"""The search behind `ferry plan`: for one candidate (GPU kind, tensor parallelism, batching settings), the fewest
replicas whose simulated cluster meets the SLO at the target rate.

A search, not an enumeration: one replica's sustainable rate under the SLO (``experiments.studies.ratesearch``,
bisection over rates, from the target rate; below a rate it fails at, from the requests/s it carried there) gives a
first count, ceil(target / that rate); the count is then settled by simulating the whole cluster at the target rate,
stepping up from the estimate until the SLO is met, or down from it in growing steps (1, 1, 2, 4, ...) until it is
missed, and bisecting to the fewest that meet it. Capacity grows with replicas, which the bisection relies on; the
answer is always a count that was simulated and met the SLO, with one fewer simulated and failing it (unless it is
1).

A simulation is a function of the cluster and the requests' arrival times and lengths: one the search asks for again
(the single-replica search's run at the target rate, which the count's search asks for at one replica; a curve
point's runs at rates the candidate's own search tried) is recorded again from the first, not run again.

A closed loop of clients (``--max-concurrency``) is planned the same way with clients for the rate: one replica's
most clients within the SLO, then the fewest replicas for the clients asked (each client staying with one replica:
``experiments.runner.clients_cluster``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from experiments.errors import one_line
from experiments.plan.slo import SLO
from experiments.runner.config import RunConfig
from experiments.runner.simulation import build_replica, build_workload, run_simulation
from experiments.studies.ratesearch import max_rate
from sim.workload import Workload
from sim.workload.clients import clients_of, closed_loop, open_loop

# what each evaluation keeps of a summary
KEPT = ("completed", "failed", "request_throughput", "output_throughput", "request_goodput", "duration",
        "gpu_idle_fraction")  # fmt: skip


@dataclass(frozen=True)
class Candidate:
    """One configuration of a replica the plan may replicate."""

    hardware: str
    tensor_parallel_size: int
    policy: str
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    # disaggregated: (P, D) prefill and decode replicas per unit; ``replicas`` then counts units of P + D replicas
    pd_ratio: tuple[int, int] | None = None
    pipeline_parallel_size: int = 1
    # data-parallel ranks per replica (each a scheduler of its own; an MoE model's MoE layers span them): the search
    # counts replicas of this many ranks
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False

    def layout(self) -> str:
        """The parallel layout in short, beyond TP: "pp2", "dp8 ep", or "" for tensor parallelism alone."""
        parts = [f"pp{self.pipeline_parallel_size}" if self.pipeline_parallel_size > 1 else "",
                 f"dp{self.data_parallel_size}" if self.data_parallel_size > 1 else "",
                 "ep" if self.enable_expert_parallel else ""]  # fmt: skip
        return " ".join(p for p in parts if p)

    def settings(self) -> str:
        """The batching settings in short: the policy, a disaggregated split and the limits tried."""
        limits = [f"seqs={self.max_num_seqs}" if self.max_num_seqs else "",
                  f"tokens={self.max_num_batched_tokens}" if self.max_num_batched_tokens else ""]  # fmt: skip
        extra = ",".join(x for x in limits if x)
        split = f" {self.pd_ratio[0]}P:{self.pd_ratio[1]}D" if self.pd_ratio else ""
        return f"{self.policy}{split}" + (f" {extra}" if extra else "")

    def label(self) -> str:
        layout = f" {self.layout()}" if self.layout() else ""
        return f"{self.hardware} tp{self.tensor_parallel_size}{layout} {self.settings()}"

    def vllm_flags(self) -> str:
        """The layout and limits as `vllm serve`'s flags."""
        flags = [f"--tensor-parallel-size {self.tensor_parallel_size}"]
        if self.pipeline_parallel_size > 1:
            flags.append(f"--pipeline-parallel-size {self.pipeline_parallel_size}")
        if self.data_parallel_size > 1:
            flags.append(f"--data-parallel-size {self.data_parallel_size}")
        if self.enable_expert_parallel:
            flags.append("--enable-expert-parallel")
        if self.max_num_seqs:
            flags.append(f"--max-num-seqs {self.max_num_seqs}")
        if self.max_num_batched_tokens:
            flags.append(f"--max-num-batched-tokens {self.max_num_batched_tokens}")
        return " ".join(flags)

    def gpus_per_replica(self) -> int:
        """GPUs of one replica: tensor x pipeline x data-parallel."""
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size

    def replicas_per_unit(self) -> int:
        """Replicas of one unit the search counts: one, or P + D when disaggregated."""
        return sum(self.pd_ratio) if self.pd_ratio else 1

    def config(self, base: RunConfig, replicas: int, router: str, router_seed: int) -> RunConfig:
        """``base`` with this candidate's replica, ``replicas`` of them behind ``router`` (disaggregated: ``replicas``
        units of P prefill and D decode replicas, each pool behind its own ``router``)."""
        data = base.model_dump(exclude_unset=True)
        scheduler = dict(data.pop("scheduler", {}))
        scheduler["policy"] = self.policy
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) is not None:
                scheduler[name] = getattr(self, name)
        data |= {"hardware": self.hardware, "tensor_parallel_size": self.tensor_parallel_size, "scheduler": scheduler}
        for name, default in (("pipeline_parallel_size", 1), ("data_parallel_size", 1),
                              ("enable_expert_parallel", False)):  # fmt: skip
            if getattr(self, name) != default:
                data[name] = getattr(self, name)
        data["replicas"] = replicas
        if self.pd_ratio is not None:
            p, d = self.pd_ratio
            data["replicas"] = 1
            data["disaggregation"] = {"prefill": {"count": p * replicas}, "decode": {"count": d * replicas}}
            data |= {"router": router, "router_seed": router_seed}
        elif replicas * self.data_parallel_size > 1:
            data |= {"router": router, "router_seed": router_seed}
        else:
            data.pop("router", None)
            data.pop("router_seed", None)
        data.pop("workload", None)
        return RunConfig.model_validate(data)


@dataclass
class Evaluation:
    """One simulation the search ran."""

    replicas: int
    rate: float  # requests/s (a closed loop's: clients, ``load_unit``)
    meets: bool
    ratios: dict[str, float]  # achieved / limit per SLO key
    summary: dict[str, Any]  # KEPT keys and the SLO's


@dataclass
class CandidateResult:
    candidate: Candidate
    replicas: int | None = None  # fewest that meet the SLO; None when dropped
    gpus: int | None = None
    reason: str | None = None  # why the candidate was dropped
    single_replica_rate: float | None = None  # what one replica sustains under the SLO (requests/s, or clients)
    achieved: dict[str, Any] = field(default_factory=dict)  # the chosen cluster's summary (KEPT and SLO keys)
    headroom: dict[str, float] = field(default_factory=dict)  # achieved / limit per SLO key
    evaluations: list[Evaluation] = field(default_factory=list)
    closest: Evaluation | None = None  # when no count met the SLO: the evaluation nearest to it

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["label"] = self.candidate.label()
        return out


def scaled(workload: Workload, factor: float) -> Workload:
    """The workload with arrivals ``factor`` times as fast (the same requests, the same pattern); a closed loop of
    clients with ``factor`` times as many clients (at least one), the same requests due at the same times."""
    clients = clients_of(workload)
    if clients is not None:
        return closed_loop(open_loop(workload), max(1, round(clients * factor)))
    return dataclasses.replace(workload, arrival_s=np.asarray(workload.arrival_s) / factor)


def simulated(result: CandidateResult, workload: Workload) -> dict[tuple[int, bytes], Evaluation]:
    """The simulations behind ``result``, a plan on ``workload``, by what decides each (``_key``): what a later plan
    of the same candidate, SLO and router on the same requests (at another rate: ``scaled``) takes as ``known``."""
    target = workload_rate(workload)
    return {_key(e.replicas, scaled(workload, e.rate / target)): e for e in result.evaluations}


def _key(replicas: int, workload: Workload) -> tuple[int, bytes]:
    """What decides a simulation of a candidate beyond its SLO and router: the replicas and the requests (arrival
    times and lengths, bit for bit)."""
    digest = hashlib.blake2b(digest_size=16)
    for values in (workload.arrival_s, workload.prompt_tokens, workload.output_tokens):
        digest.update(np.ascontiguousarray(values).tobytes())
    return replicas, digest.digest()


def workload_rate(workload: Workload) -> float:
    """The workload's load: its mean arrival rate (requests/s), or a closed loop's clients (``load_unit``)."""
    clients = clients_of(workload)
    if clients is not None:
        return float(clients)
    span = float(workload.arrival_s[-1] - workload.arrival_s[0]) if len(workload.arrival_s) > 1 else 0.0
    return (len(workload.arrival_s) - 1) / span if span > 0 else math.inf


def load_unit(workload: Workload) -> str:
    """What ``workload_rate`` counts: "req/s", or "clients" for a closed loop (``--max-concurrency``)."""
    return "req/s" if clients_of(workload) is None else "clients"


def plan_candidate(
    candidate: Candidate,
    base: RunConfig,
    workload: Workload,
    slo: SLO,
    router: str = "round_robin",
    router_seed: int = 0,
    max_replicas: int = 256,
    single_rate: float | None = None,
    known: dict[tuple[int, bytes], Evaluation] | None = None,
) -> CandidateResult:
    """The fewest replicas of ``candidate`` meeting ``slo`` on ``workload`` at its own rate; dropped with a reason
    if the replica cannot run (the model does not fit, the TP does not divide the heads, a layout vLLM refuses) or no
    count up to ``max_replicas`` meets the SLO. ``single_rate``: one replica's sustainable rate, when already known;
    ``known``: simulations of this candidate already run (``simulated``), recorded again where the search asks for
    one of them. A replica of a data-parallel candidate is all its ranks."""
    result = CandidateResult(candidate)
    target = workload_rate(workload)
    try:
        build_replica(candidate.config(base, 1, router, router_seed))
    except ValueError as exc:
        result.reason = f"does not run: {one_line(exc)}"
        return result
    thresholds = slo.thresholds()
    reads_gaps = any("_itl_" in key for key in slo.limits)  # no limit on the token gaps: their statistics spared
    ran = dict(known or {})

    def evaluate(replicas: int, rate: float) -> Evaluation:
        arrivals = scaled(workload, rate / target)
        key = _key(replicas, arrivals)
        if key not in ran:
            config = candidate.config(base, replicas, router, router_seed)
            config = config.model_copy(update={"goodput": thresholds})
            summary = run_simulation(config, workload=arrivals, detail=False, token_gaps=reads_gaps).summary
            meets, ratios = slo.check(summary)
            ran[key] = Evaluation(replicas, rate, meets, ratios, {k: summary.get(k) for k in (*KEPT, *slo.limits)})
        first = ran[key]
        evaluation = Evaluation(replicas, rate, first.meets, dict(first.ratios), dict(first.summary))
        result.evaluations.append(evaluation)
        return evaluation

    if single_rate is None:
        # from the target rate (the count's search asks for one replica there too), below a failed rate at what the
        # overloaded replica carried (its requests/s), which the SLO's rate is under
        closed = clients_of(workload) is not None  # the load is clients: what an overloaded run carried says nothing
        search = max_rate(lambda r: _as_summary(evaluate(1, r)), lambda s: bool(s["meets"]), start=target,
                          rel_tol=0.1, max_evaluations=12, lower=None if closed else _carried)  # fmt: skip
        single_rate = search.rate
    result.single_replica_rate = single_rate
    if single_rate <= 0:
        unloaded = min((e for e in result.evaluations if e.replicas == 1), key=lambda e: e.rate)
        result.reason = f"misses the SLO even lightly loaded ({_worst(unloaded)} at {unloaded.rate:.3g} req/s)"
        result.closest = unloaded
        return result
    tried: dict[int, Evaluation] = {}

    def ok(replicas: int) -> bool:
        if replicas not in tried:
            tried[replicas] = evaluate(replicas, target)
        return tried[replicas].meets

    estimate = min(max(1, math.ceil(target / single_rate)), max_replicas)
    if ok(estimate):
        # down from the estimate in growing steps (1, 1, 2, 4, ...: a cluster shares its load better than one
        # replica, so the answer is often a few below it), then bisect the last step
        lo, hi = 0, estimate
        while hi > 1:
            below = hi - max(1, estimate - hi)
            if below < 1:
                break
            if not ok(below):
                lo = below
                break
            hi = below
    else:
        lo, hi = estimate, estimate
        while not ok(hi):
            lo = hi
            if hi >= max_replicas:
                result.closest = min(tried.values(), key=lambda e: max(e.ratios.values()))
                result.reason = f"misses the SLO with {max_replicas} replicas ({_worst(tried[hi])})"
                return result
            hi = min(max_replicas, max(hi + 1, math.ceil(hi * 1.5)))
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    chosen = tried[hi]
    result.replicas = hi
    result.gpus = hi * candidate.replicas_per_unit() * candidate.gpus_per_replica()
    # the load it serves: the target rate, and the output tokens per second that brings (not the measured
    # throughput, which counts the drain after the last arrival and so favours faster GPUs)
    served = chosen.summary.get("request_throughput") or 0.0
    share = (chosen.summary.get("request_goodput") or 0.0) / served if served else 0.0
    # a closed loop's clients offer what the cluster serves them: its measured rates
    closed = clients_of(workload) is not None
    rate = served if closed else target
    offered = (
        (chosen.summary.get("output_throughput") or 0.0) if closed else target * float(np.mean(workload.output_tokens))
    )
    result.achieved = (
        chosen.summary
        | {
            "target_rate": rate,
            "offered_output_tokens_per_s": offered,
            "goodput_share": share,
        }
        | ({"clients": int(target)} if closed else {})
    )
    result.headroom = chosen.ratios
    return result


def _carried(rate: float, summary: dict[str, Any]) -> float:
    """Below a rate (requests/s) one replica failed at: the requests/s it carried there (0 when it carried none)."""
    return float(summary.get("request_throughput") or 0.0)


def _as_summary(evaluation: Evaluation) -> dict[str, Any]:
    return {"meets": evaluation.meets, **evaluation.summary}


def _worst(evaluation: Evaluation) -> str:
    """The SLO term furthest over its limit, as words."""
    if evaluation.summary.get("failed"):
        return f"{evaluation.summary['failed']} requests rejected"
    key, ratio = max(evaluation.ratios.items(), key=lambda kv: kv[1])
    return f"{key} at {ratio:.2f}x its limit"


def stability(result: CandidateResult, base: RunConfig, workload: Workload, slo: SLO, router: str, router_seed: int,
              repeats: int) -> dict[str, Any] | None:  # fmt: skip
    """How far the answer for ``result`` (a candidate that met the SLO) rests on the workload's draw: for a synthetic
    workload, its count and one fewer simulated again on ``repeats`` other seeds (the same rate or clients), and on
    how many of the seeds (the plan's own first) the count meets the SLO with one fewer failing (``holds``). None for
    a trace, which is one sample: its count is exact for it."""
    if base.workload.trace is not None or result.replicas is None or repeats < 1:
        return None
    factor = workload_rate(workload) / workload_rate(build_workload(base))
    checks = [{"seed": base.workload.seed, "meets": True, "fewer_meets": False}]
    for k in range(1, repeats + 1):
        seed = base.workload.seed + k
        other = scaled(build_workload(base.model_copy(update={"workload": base.workload.model_copy(
            update={"seed": seed})})), factor)  # fmt: skip
        config = result.candidate.config(base, result.replicas, router, router_seed)
        config = config.model_copy(update={"goodput": slo.thresholds()})
        meets = slo.check(run_simulation(config, workload=other, detail=False, token_gaps=False).summary)[0]
        fewer_meets = False
        if meets and result.replicas > 1:
            fewer = result.candidate.config(base, result.replicas - 1, router, router_seed)
            fewer = fewer.model_copy(update={"goodput": slo.thresholds()})
            fewer_meets = slo.check(run_simulation(fewer, workload=other, detail=False, token_gaps=False).summary)[0]
        checks.append({"seed": seed, "meets": bool(meets), "fewer_meets": bool(fewer_meets)})
    return {"label": result.candidate.label(), "replicas": result.replicas, "requests": len(workload.arrival_s),
            "seeds": checks, "holds": sum(c["meets"] and not c["fewer_meets"] for c in checks)}  # fmt: skip
