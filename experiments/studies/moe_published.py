"""ferry against published serving benchmarks of MoE models (GPT-OSS-120B, Qwen3-235B-A22B in BF16 and FP8,
DeepSeek-R1): the MoE table of docs/checks/published.md.

    python -m experiments.studies.moe_published            # every point (about a minute on 2 cores)
    python -m experiments.studies.moe_published --json out.json

The sources, their settings and their citations are in ``experiments/studies/moe_published.yaml``: each point is a
`vllm bench serve` run of fixed-length random prompts sent all at once, simulated with ``ferry run``'s code
(``runner.simulation.run_simulation``) under the same `vllm serve` settings. Printed per point: the published
and predicted benchmark duration, total token throughput, mean TTFT and mean TPOT, and their ratio; then, per
source, the median |ferry / published - 1| of each metric.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from costmodel import strict_yaml

SOURCES = Path(__file__).with_name("moe_published.yaml")
# the published metrics, in the order of a point's columns after its tokens and requests, and ferry's summary keys
METRICS = (("duration", "duration"), ("total_token_throughput", "total_token_throughput"),
           ("mean_ttft_ms", "mean_ttft_ms"), ("mean_tpot_ms", "mean_tpot_ms"))  # fmt: skip


def runs(sources: dict[str, Any]) -> list[dict[str, Any]]:
    """One ``ferry run`` config and its published figures per point."""
    out = []
    for key, src in sources.items():
        for input_tokens, generated, requests, *published in src["points"]:
            isl, osl = round(input_tokens / requests), max(1, round(generated / requests))
            config = {"model": src["model"], "hardware": src["hardware"],
                      "tensor_parallel_size": src["tensor_parallel_size"], "policy": "chunked",
                      "vllm_defaults": str(src["vllm"]), "num_prompts": requests, "request_rate": "inf",
                      "input_len": isl, "output_len": osl, "enable_prefix_caching": True}  # fmt: skip
            for field in ("max_model_len", "max_num_batched_tokens"):
                if field in src:
                    config[field] = src[field]
            out.append({"source": key, "label": f"{src['model']} {isl}/{osl} x{requests}", "config": config,
                        "published": dict(zip((m for m, _ in METRICS), published, strict=True))})  # fmt: skip
    return out


def predict(point: dict[str, Any]) -> dict[str, float]:
    from experiments.runner.config import RunConfig
    from experiments.runner.simulation import run_simulation

    summary = run_simulation(RunConfig.model_validate(point["config"])).summary
    return {name: float(summary[key]) for name, key in METRICS}


def table(points: list[dict[str, Any]]) -> str:
    head = (
        "| model, input/output x requests | " + " | ".join(f"{m}: published / ferry (ratio)" for m, _ in METRICS) + " |"
    )
    lines = [head, "| --- |" + " ---: |" * len(METRICS)]
    for p in points:
        cells = [f"{p['published'][m]:,.4g} / {p['predicted'][m]:,.4g} ({p['predicted'][m] / p['published'][m]:.2f})"
                 for m, _ in METRICS]  # fmt: skip
        lines.append(f"| {p['label']} | " + " | ".join(cells) + " |")
    lines.append("")
    for source in dict.fromkeys(p["source"] for p in points):
        mine = [p for p in points if p["source"] == source]
        for which, chosen in (("all", mine), ("without short prompts", [p for p in mine if not short(p)])):
            errs = {m: statistics.median(abs(p["predicted"][m] / p["published"][m] - 1) for p in chosen)
                    for m, _ in METRICS}  # fmt: skip
            lines.append(f"{source} ({which}): median |ferry / published - 1|: "
                         + ", ".join(f"{m} {e:.0%}" for m, e in errs.items()))  # fmt: skip
    return "\n".join(lines)


def short(point: dict[str, Any]) -> bool:
    """A run of short prompts (GPUStack's 128 in, 4 out): the API server's work per request (chat template,
    tokenization, detokenization of a thousand requests sent at once), which ferry does not simulate, sets its pace."""
    return int(point["config"]["input_len"]) <= 256


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path, default=None, help="also write the points here")
    args = p.parse_args(argv)
    points = runs(strict_yaml.load(SOURCES.read_text())["sources"])
    for point in points:
        point["predicted"] = predict(point)
    print(table(points))
    if args.json is not None:
        args.json.write_text(json.dumps(points, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
