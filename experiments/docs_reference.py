"""The documentation site's reference pages, written from the code so that they cannot drift from it:

    python -m experiments.docs_reference            # writes docs/reference/cli.md and docs/reference/outputs.md
    python -m experiments.docs_reference --check    # exit 1 when the committed pages differ from what it writes

``cli.md`` walks the argparse parser of every `ferry` subcommand (``experiments.cli.build_parser``): its usage,
description and every flag with its help and default. ``outputs.md`` runs a few small simulations in a temporary
folder (one replica, one with goodput, a cluster of two, prefill/decode pools; a sweep of one point in each mode) and
lists the keys of ``summary.json`` and the columns of ``requests.csv``, ``iterations.csv``, ``batches.csv`` and a
sweep's ``results.parquet`` in the order the code writes them. ``iterations.csv``'s glosses are the comments beside
``sim.records.ITERATION_COLUMNS``; the others are ``experiments.docs_glosses``, and a key without one is an error
(so a new key cannot ship undocumented). ``tests/test_docs.py`` checks that the committed pages equal what this
writes now.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import sys
import tempfile
import tokenize
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference"
WIDTH = 100  # the usage lines' width, fixed so that the page does not follow the terminal
GENERATED = "<!-- written by `python -m experiments.docs_reference`; do not edit by hand -->\n"


# ---- the command line ----------------------------------------------------------------------------------------------


def _cell(text: str) -> str:
    """One table cell: one line, pipes escaped, RST's double backticks as Markdown's."""
    text = re.sub(r"``([^`]+)``", r"`\1`", " ".join(text.split()))
    return text.replace("|", "\\|")


def _default(action: argparse.Action) -> str:
    value = action.default
    if value is None or value is argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
        return ""
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction) or isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list | tuple):
        value = " ".join(str(v) for v in value)
    return f"`{_cell(str(value))}`" if str(value) != "" else '`""`'


def _flag(action: argparse.Action, formatter: argparse.HelpFormatter) -> str:
    if not action.option_strings:
        return f"`{formatter._metavar_formatter(action, action.dest)(1)[0]}`"
    if action.nargs == 0:
        return ", ".join(f"`{o}`" for o in action.option_strings)
    args = formatter._format_args(action, action.dest.upper())
    return ", ".join(f"`{o} {args}`" for o in action.option_strings)


def _command_section(name: str, parser: argparse.ArgumentParser) -> list[str]:
    formatter = parser.formatter_class(prog=parser.prog, width=WIDTH)  # type: ignore[call-arg]
    usage = argparse.HelpFormatter(prog=parser.prog, width=WIDTH)
    usage.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups, prefix="")
    lines = [f"## `ferry {name}`", "", "```text", usage.format_help().strip("\n"), "```", ""]
    if parser.description:
        lines += ["```text", parser.description.strip("\n"), "```", ""]
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a.help is not argparse.SUPPRESS]
        actions = [a for a in actions if not isinstance(a, argparse._HelpAction)]
        if not actions:
            continue
        title = group.title or "options"
        lines += [f"**{title}**" + (f": {_cell(group.description)}" if group.description else ""), ""]
        lines += ["| flag | default | what it does |", "| --- | --- | --- |"]
        for action in actions:
            help_text = formatter._expand_help(action) if action.help else ""
            if action.choices is not None and not isinstance(action.choices, dict):
                listed = ", ".join(str(c) for c in action.choices)
                if listed not in help_text:
                    help_text += f" (one of: {listed})"
            lines.append(f"| {_flag(action, formatter)} | {_default(action)} | {_cell(help_text)} |")
        lines.append("")
    return lines


def cli_markdown() -> str:
    """docs/reference/cli.md: every subcommand of `ferry`, in the order `ferry --help` lists them."""
    from experiments.cli import COMMANDS, build_parser

    parser = build_parser([])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    lines = [
        "# Command line reference",
        "",
        GENERATED.rstrip("\n"),
        "",
        "Every `ferry` subcommand with every flag, its default and its help, as `ferry COMMAND --help` prints them.",
        "`ferry --debug COMMAND ...` shows a traceback instead of a one-line error. A user's error exits with",
        "status 2, Ctrl-C with 130. The guides say what the flags are for: [getting started](../getting-started.md).",
        "",
        " ".join(f"[`{name}`](#ferry-{name})" for name in COMMANDS),
        "",
    ]
    for name in COMMANDS:
        lines += _command_section(name, sub.choices[name])
    return "\n".join(lines).rstrip("\n") + "\n"


# ---- the outputs ---------------------------------------------------------------------------------------------------


def _source_comments(path: Path, names: tuple[str, ...]) -> dict[str, str]:
    """The comment beside each ``"name",`` in a module's tuples (``sim/records.py``'s column lists)."""
    comments: dict[str, str] = {}
    last: str | None = None
    with path.open("rb") as f:
        for tok in tokenize.tokenize(f.readline):
            if tok.type == tokenize.STRING and tok.string.strip("\"'") in names:
                last = tok.string.strip("\"'")
            elif tok.type == tokenize.COMMENT and last is not None:
                comments.setdefault(last, tok.string.lstrip("# ").strip())
                last = None
            elif tok.type == tokenize.NEWLINE or tok.type == tokenize.NL:
                last = None if tok.type == tokenize.NEWLINE else last
    return comments


def _quiet_run(argv: list[str]) -> None:
    from experiments.cli import main

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = main(argv)
    if code != 0:
        raise RuntimeError(f"ferry {' '.join(argv)} exited {code}")


SMALL = ["--hardware", "h100-sxm.datasheet", "--num-prompts", "20", "--input-len", "64", "--output-len", "16",
         "--request-rate", "10", "--seed", "0"]  # fmt: skip
RUNS = {  # what each example run adds to the outputs
    "one replica": ["--record-batches", "--goodput", "ttft:2000", "tpot:100"],
    "a cluster (`--replicas 2`)": ["--replicas", "2", "--record-batches"],
    "prefill/decode pools (`--prefill-replicas 1 --decode-replicas 1`)": [
        "--prefill-replicas", "1", "--decode-replicas", "1", "--policy", "chunked", "--goodput", "ttft:2000",
    ],
    "speculative decoding (`--speculative-config`)": [
        "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}',
    ],
}  # fmt: skip


def _columns(path: Path) -> list[str]:
    return path.read_text().splitlines()[0].split(",")


def _collect(tmp: Path) -> dict[str, Any]:
    """Run the example runs and sweeps in ``tmp``; the keys and columns each wrote, in order."""
    out: dict[str, Any] = {}
    for label, extra in RUNS.items():
        folder = tmp / f"run{len(out)}"
        _quiet_run(["run", *SMALL, *extra, "--out", str(folder)])
        files = {p.name: _columns(p) for p in sorted(folder.glob("*.csv"))}
        out[label] = {"summary": json.loads((folder / "summary.json").read_text()), "files": files}
    base = "{model: llama-3-8b, hardware: h100-sxm.datasheet, num_prompts: 20, input_len: 64, output_len: 16, "
    for mode, lines in (("run", ""), ("max_rate", "mode: max_rate\nslo: {ttft_p99_ms: 2000}\n")):
        sweep = tmp / f"sweep-{mode}.yaml"
        sweep.write_text(f"base: {base}request_rate: 10}}\ngrid:\n  max_num_seqs: [8]\n{lines}")
        _quiet_run(["sweep", str(sweep), "--out", str(tmp / f"sweep-{mode}"), "--jobs", "1"])
        import pyarrow.parquet as pq

        out[f"sweep {mode}"] = pq.read_schema(tmp / f"sweep-{mode}" / "results.parquet").names
    return out


def _gloss(key: str, glosses: dict[str, str]) -> str:
    from experiments.docs_glosses import FAMILIES, family_words

    if key in glosses:
        return glosses[key]
    for pattern, template in FAMILIES:
        m = re.fullmatch(pattern, key)
        if m:
            return template.format(**family_words(**m.groupdict()))
    raise KeyError(f"{key!r} has no gloss: add one to experiments/docs_glosses.py")


def _table(keys: list[str], glosses: dict[str, str], where: dict[str, str] | None = None) -> list[str]:
    head = ["| key | present | what it is |", "| --- | --- | --- |"]
    return head + [f"| `{k}` | {(where or {}).get(k, 'always')} | {_cell(_gloss(k, glosses))} |" for k in keys]


def _ordered_union(lists: list[list[str]]) -> list[str]:
    seen: dict[str, None] = {}
    for keys in lists:
        seen.update(dict.fromkeys(keys))
    return list(seen)


def _where(per_run: dict[str, list[str]]) -> dict[str, str]:
    """For each key, in which of the example runs it appears ("always" when in all)."""
    everywhere = set.intersection(*(set(keys) for keys in per_run.values()))
    where: dict[str, str] = {}
    for key in _ordered_union(list(per_run.values())):
        if key not in everywhere:
            where[key] = "; ".join(label for label, keys in per_run.items() if key in keys)
    return where


def outputs_markdown() -> str:
    """docs/reference/outputs.md: every file `ferry run` and `ferry sweep` write, key by key and column by column."""
    from experiments import docs_glosses as g
    from sim.records import ITERATION_COLUMNS

    with tempfile.TemporaryDirectory() as tmp:
        got = _collect(Path(tmp))
    runs = {label: got[label] for label in RUNS}
    iteration_glosses = _source_comments(ROOT / "sim" / "records.py", ITERATION_COLUMNS) | g.ITERATION_EXTRA
    summary_where = _where({label: list(r["summary"]) for label, r in runs.items()})
    summary_where |= {k: "with `--goodput`" for k in ("request_goodput", "goodput_slos_ms") if k in summary_where}
    lines = [
        "# Outputs reference",
        "",
        GENERATED.rstrip("\n"),
        "",
        "What `ferry run` writes into `--out`, and what `ferry sweep` writes into its folder, in the order they are",
        "written. The lists come from small runs of the current code: one replica with `--record-batches` and",
        "`--goodput`, " + ", ".join(list(RUNS)[1:]) + "; a key written only by some of them says which. Times in",
        "seconds unless the name says `_ms`; `null` where a statistic has no values. [`ferry run`](../guide/run.md)",
        "says how the files are written; the [glossary](../concepts/glossary.md) explains the batching terms.",
        "",
        "## `summary.json`",
        "",
        *_table(_ordered_union([list(r["summary"]) for r in runs.values()]), g.SUMMARY, summary_where),
        "",
    ]
    for key, label in g.NESTED:
        objects = [(name, r["summary"][key]) for name, r in runs.items() if key in r["summary"]]
        fields = _ordered_union([list(_first(obj)) for _, obj in objects])
        glosses = g.NESTED_FIELDS[key]
        if key == "config":  # a field without a line of its own is the `ferry run` flag of that name
            glosses = {f: f"`--{f.replace('_', '-')}`" for f in fields} | glosses
        lines += [f"### `{key}`: {label}", "", *_table(fields, glosses), ""]
    for name in ("requests.csv", "iterations.csv", "batches.csv"):
        per_run = {label: r["files"][name] for label, r in runs.items() if name in r["files"]}
        glosses = iteration_glosses if name == "iterations.csv" else g.COLUMNS[name]
        lines += [f"## `{name}`", "", g.FILE_NOTES[name], ""]
        lines += [*_table(_ordered_union(list(per_run.values())), glosses, _where(per_run)), ""]
    sweep_where = _where({"`mode: run`": got["sweep run"], "`mode: max_rate`": got["sweep max_rate"]})
    sweep_keys = [k for k in _ordered_union([got["sweep run"], got["sweep max_rate"]]) if k not in g.SWEPT_EXAMPLE]
    lines += ["## A sweep's `results.parquet`", "", g.FILE_NOTES["results.parquet"], ""]
    lines += ["| column | present | what it is |", "| --- | --- | --- |"]
    for key in sweep_keys:
        sweep_gloss = g.SWEEP.get(key) or "the key of the point's `summary.json` of that name (above)"
        if key not in g.SWEEP:
            _gloss(key, g.SUMMARY)  # a summary key: it must have a gloss above
        lines.append(f"| `{key}` | {sweep_where.get(key, 'always')} | {_cell(sweep_gloss)} |")
    return "\n".join(lines).rstrip("\n") + "\n"


def _first(value: Any) -> dict[str, Any]:
    """An object's fields: a list's first item's, a dict of dicts' (``pools``) first value's, else the dict's."""
    if isinstance(value, list):
        return value[0] if value else {}
    if value and all(isinstance(v, dict) for v in value.values()):
        return next(iter(value.values()))
    return value


PAGES = {"cli.md": cli_markdown, "outputs.md": outputs_markdown}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.docs_reference", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed pages; write nothing")
    args = parser.parse_args(argv)
    stale = []
    for name, write in PAGES.items():
        path = REFERENCE / name
        text = write()
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path.relative_to(ROOT)))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print(f"stale: {', '.join(stale)} (run python -m experiments.docs_reference)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
