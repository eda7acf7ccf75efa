"""Every device profile fitted to NVIDIA's measured kernel database, and their held-out errors (the tables of
docs/checks/measured-kernels.md).

    python -m experiments.studies.kernel_fits                  # fit and print (nothing written)
    python -m experiments.studies.kernel_fits --write          # also write hwprofiles/<device>[.<framework>].yaml
    python -m experiments.studies.kernel_fits --systems h100_sxm --frameworks vllm --markdown

For each system of ``aiconfigurator-core`` that ferry has a device for (``SYSTEMS``) and each engine (vLLM, SGLang,
TensorRT-LLM), this fits the device's datasheet profile to the engine's current release of the tables, as
``ferry calibrate --from-aiconfigurator SYSTEM --framework F`` does, and prints per kernel class (GEMM, prefill and
decode attention, all-reduce) the held-out median and p90 of |predicted / measured - 1|, for the fitted curves alone
and for the tables (what ferry uses where the package is installed), over every measured shape and over the shapes
of ferry's built-in dense models (``--markdown``: both as the docs' tables), beside how far the database agrees
with itself (``measured.neighbour_spread``: its GEMMs at m and m + 1). About 3 s per profile.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from costmodel import kerneldb
from costmodel.calibration.aiconfigurator import FRAMEWORKS, SYSTEMS, profile_name
from costmodel.calibration.measured import fit_database, neighbour_spread
from costmodel.hardware import PROFILES_DIR, load_hardware, save_hardware

LABELS = {"gemm": "GEMM", "attention_prefill": "prefill attention", "attention_decode": "decode attention",
          "all_reduce": "all-reduce"}  # fmt: skip


def fit_all(systems: list[str], frameworks: list[str], write: Path | None) -> pd.DataFrame:
    """One row per (profile, kernel class) with its held-out errors; the profiles written to ``write`` if given."""
    rows = []
    for system in systems:
        for framework in frameworks:
            name = profile_name(system, framework)
            fitted = fit_database(system, framework, load_hardware(f"{SYSTEMS[system]}.datasheet"), name=name)
            tables = fitted.profile.kernel_tables
            assert tables is not None
            if write is not None:
                save_hardware(fitted.profile, write / f"{name}.yaml",
                              f"ferry calibrate --from-aiconfigurator {system} --framework {framework}")  # fmt: skip
            gemm = kerneldb.read(system, "gemm_perf", framework, tables.version)
            spread = {f"spread_{k}": v for k, v in neighbour_spread(gemm).items()}
            for r in fitted.errors.to_dict(orient="records"):
                rows.append({"profile": name, "system": system, "framework": framework, "version": tables.version}
                            | r | spread)  # fmt: skip
            print(f"{name}: {tables.describe()}", flush=True)
    return pd.DataFrame(rows)


def markdown(errors: pd.DataFrame, models: bool = False) -> str:
    """The docs' table: one row per profile, per class the held-out median / p90 of the tables (and the curves);
    ``models``: of the tables on the held-out shapes of ferry's built-in dense models alone (and how many)."""
    classes = [c for c in LABELS if c in set(errors["op_class"])]
    what = "tables, ferry's models (shapes)" if models else "tables (curves)"
    head = "| profile | engine | " + " | ".join(f"{LABELS[c]}: {what}" for c in classes) + " |"
    head += "" if models else " GEMM m vs m + 1 in the database |"
    lines = [head, "| --- | --- |" + " --- |" * (len(classes) + (not models))]
    for (profile, framework, version), g in errors.groupby(["profile", "framework", "version"], sort=False):
        cells = []
        for c in classes:
            r = g[g["op_class"] == c]
            if r.empty or (models and not r.iloc[0].models_held_out):
                cells.append("not measured")
                continue
            r = r.iloc[0]
            if models:
                cells.append(f"{r.models_median:.1%} / {r.models_p90:.1%} ({r.models_held_out:,})")
            else:
                cells.append(f"{r.table_median:.1%} / {r.table_p90:.1%} ({r.curve_median:.0%} / {r.curve_p90:.0%})")
        if not models:
            r = g.iloc[0]
            cells.append(f"{r.spread_median:.1%} / {r.spread_p90:.1%}")
        lines.append(f"| `{profile}` | {framework} {version} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=sorted(SYSTEMS))
    p.add_argument("--frameworks", nargs="+", default=list(FRAMEWORKS), choices=FRAMEWORKS)
    p.add_argument("--write", action="store_true", help=f"write the profiles into {PROFILES_DIR}")
    p.add_argument("--markdown", action="store_true", help="print the docs' table (docs/checks/measured-kernels.md)")
    args = p.parse_args(argv)
    errors = fit_all(args.systems, args.frameworks, PROFILES_DIR if args.write else None)
    if args.markdown:
        print(markdown(errors))
        print()
        print(markdown(errors, models=True))
    else:
        shown = errors.assign(
            **{c: errors[c].map("{:.1%}".format) for c in errors.columns if "median" in c or "p90" in c}
        )
        print(shown.drop(columns=["curve_bias", "table_bias", "system", "spread_n"]).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
