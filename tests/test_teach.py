"""`ferry teach`: the teaching scenarios show what the chapter says they show, read from ferry's own records, and
every figure is written, in both languages, with the colours of what it shows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from experiments.cli import main
from experiments.teach import style
from experiments.teach.animate import frame_times
from experiments.teach.runs import PolicyRun, run_scenario
from experiments.teach.scenario import Scenario, builtin_scenarios, load_scenario, pick_scenarios
from experiments.teach.settings import load_settings
from experiments.teach.spans import request_spans, seat_assignment


@pytest.fixture(scope="module")
def runs() -> dict[str, dict[str, PolicyRun]]:
    return {s.name: {r.label: r for r in run_scenario(s)} for s in builtin_scenarios()}


def members(run: PolicyRun, number: int) -> dict[str, str]:
    """Who rode in iteration ``number`` (1-based) and in which phase."""
    b = run.batches[run.batches.iteration == number - 1]
    return dict(zip(b.request_id, b.phase, strict=True))


def last_iteration(run: PolicyRun, rid: str) -> int:
    return run.iterations_of(rid)[-1]


# ---- the chapter's scenarios, from the records ------------------------------------------------------------------


def test_aligned_prefills_together_then_decodes_together(runs) -> None:  # 6-6
    for label in ("static", "continuous"):
        run = runs["aligned"][label]
        assert members(run, 1) == {"1": "prefill", "2": "prefill", "3": "prefill"}
        for k in (2, 3, 4):
            assert members(run, k) == {"1": "decode", "2": "decode", "3": "decode"}
        assert len(run.iterations) == 4
    assert len(runs["aligned"]["none"].iterations) == 12  # one request at a time: 3 x (1 prefill + 3 decodes)


def test_static_and_dynamic_hold_seats_for_the_longest_member(runs) -> None:  # 6-3
    for label in ("static", "dynamic"):
        run = runs["refill"][label]
        req = run.requests
        # requests 1 and 2 finish early but give their seats back only when request 3 finishes
        assert (
            req.loc["1", "finish_ms"] < req.loc["3", "finish_ms"]
            and req.loc["2", "finish_ms"] < req.loc["3", "finish_ms"]
        )
        assert req.loc["1", "released_ms"] == req.loc["2", "released_ms"] == req.loc["3", "finish_ms"]
        # 4, 5 and 6 board only in the iteration after request 3's last one
        after = last_iteration(run, "3") + 1
        assert [run.admitted_in(r) for r in ("4", "5", "6")] == [after] * 3
        # the held seat-time drawn is the time between each request's last token and its release
        held = float((req.released_ms - req.finish_ms).sum())
        assert run.seat_ms()["held"] == pytest.approx(held, rel=1e-9)
        assert held > 100  # ms: a visible share of the picture


def test_continuous_refills_the_freed_seat_at_once(runs) -> None:  # 6-4
    for label in ("continuous", "chunked"):
        run = runs["refill"][label]
        for gone, comes in (("1", "4"), ("2", "5"), ("5", "6")):
            assert run.admitted_in(comes) == last_iteration(run, gone) + 1, (label, gone, comes)
        seat_of = seat_assignment(run)
        assert seat_of["4"] == seat_of["1"] and seat_of["5"] == seat_of["2"] and seat_of["6"] == seat_of["5"]
        assert run.seat_ms()["held"] == 0
    # and against static batching on the same requests: earlier first tokens and responses
    assert runs["refill"]["continuous"].summary["mean_ttft_ms"] < runs["refill"]["static"].summary["mean_ttft_ms"]
    assert runs["refill"]["continuous"].end_ms < runs["refill"]["static"].end_ms


def test_prefill_priority_idles_request_1_and_mixing_carries_its_decode(runs) -> None:  # 6-7, 6-8
    plain, mixed = runs["prefill-priority"]["continuous"], runs["prefill-priority"]["continuous-mixed"]
    assert members(plain, 1) == {"1": "prefill"} and members(plain, 2) == {"1": "decode"}
    assert members(plain, 3) == {"2": "prefill", "3": "prefill"}  # request 1 sits out iteration 3
    stalled = request_spans(plain).query("kind == 'stalled'")
    assert stalled.request_id.tolist() == ["1"] and stalled.iteration.tolist() == [3]
    assert members(mixed, 3) == {"1": "decode", "2": "prefill", "3": "prefill"}
    # mixing hardly helps: iteration 3 lasts as long as the long prefills (its decode adds < 1%)
    d_plain = plain.iterations.end_ms[2] - plain.iterations.start_ms[2]
    d_mixed = mixed.iterations.end_ms[2] - mixed.iterations.start_ms[2]
    decode = plain.iterations.end_ms[1] - plain.iterations.start_ms[1]
    assert d_plain > 5 * decode and d_mixed == pytest.approx(d_plain, rel=0.01)


def test_chunked_prefill_keeps_request_1_decoding(runs) -> None:  # 6-9
    run = runs["chunked-prefill"]["chunked"]
    assert run.admitted_in("2") == run.admitted_in("3") == 5
    for k in range(5, 10):
        assert members(run, k) == {"1": "decode", "2": "prefill_chunk", "3": "prefill_chunk"}
        assert run.batches[run.batches.iteration == k - 1].tokens.tolist() == [1, 256, 256]
    assert run.iterations_of("2", "decode")[0] == 10  # request 2's shorter prompt is done: it decodes from 10
    assert run.iterations_of("1") == list(range(1, len(run.iterations_of("1")) + 1))  # a token every iteration
    # without chunks, request 1 sits out the long prefill; its worst gap is far larger than with chunks
    plain = runs["chunked-prefill"]["continuous"]
    assert "1" not in members(plain, plain.admitted_in("2"))
    assert plain.summary["p99_itl_ms"] > 3 * run.summary["p99_itl_ms"]
    gaps = {label: longest_gap(runs["chunked-prefill"][label], "1") for label in ("continuous", "continuous-mixed")}
    assert gaps["continuous"] > gaps["continuous-mixed"] > 5 * longest_gap(run, "1")  # docs/teaching.md's 84/76/14
    assert run.requests.loc["3", "ttft_ms"] > plain.requests.loc["3", "ttft_ms"]  # TTFT traded for ITL


def longest_gap(run: PolicyRun, rid: str) -> float:
    """The longest time (ms) between two tokens of ``rid`` (each made when its iteration ends)."""
    ends = run.iterations.end_ms.to_numpy()[[i - 1 for i in run.iterations_of(rid)]]
    return float(np.diff(ends).max())


def test_the_dock_dynamic_leaves_at_the_deadline_static_waits_for_a_full_boat(runs) -> None:
    dock = runs["dock"]
    dynamic, static, none = dock["dynamic"], dock["static"], dock["none"]
    arrival = dynamic.requests.arrival_ms
    assert dynamic.iterations.start_ms[0] == pytest.approx(arrival["1"] + 15.0)  # max_delay_ms
    assert members(dynamic, 1) == {"1": "prefill", "2": "prefill"}  # two passengers, one seat empty
    assert dynamic.seat_ms()["empty"] > 0
    assert static.iterations.start_ms[0] == pytest.approx(arrival["3"])  # the third passenger fills the boat
    assert static.gpu_idle_ms() == pytest.approx(arrival["3"] - arrival["1"])
    assert none.seats == 1 and (none.iterations.seats == 1).all()
    assert dock["continuous"].gpu_idle_ms() == 0


def test_drawn_times_agree_with_the_summary(runs) -> None:
    for scenario in runs.values():
        for run in scenario.values():
            it = run.iterations
            busy = float((it.end_ms - it.start_ms).sum())
            use = run.seat_ms()
            assert sum(use.values()) == pytest.approx(run.seats * busy, rel=1e-9)
            assert min(use.values()) >= 0
            assert run.gpu_idle_ms() == pytest.approx(run.summary["gpu_idle_s"] * 1000, abs=1e-6)
            spans = request_spans(run)
            for rid, req in run.requests.iterrows():  # each request's spans tile arrival .. release
                mine = spans[spans.request_id == rid].sort_values("start_ms")
                assert mine.start_ms.iloc[0] == req.arrival_ms and mine.end_ms.max() == req.released_ms
                assert mine.start_ms.to_numpy()[1:] == pytest.approx(mine.end_ms.to_numpy()[:-1])


# ---- scenario files ---------------------------------------------------------------------------------------------


def test_scenario_errors_name_the_field(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    base = "name: mine\ntitle: {en: a, ko: b}\n"
    cases = {
        "requests:\n  - {arrival_ms: 5, prompt: 10, output: 2}\n  - {arrival_ms: 1, prompt: 10, output: 2}\n"
        "policies: [{policy: none}]\n": "arrival order",
        "requests: [{arrival_ms: 0, prompt: 10, output: 2}]\npolicies: [{policy: none}, {policy: none}]\n": "label",
        "requests: [{arrival_ms: 0, prompt: 10, output: 2}]\npolicies: [{policy: static, max_num_seqs: 3}]\n": (
            "max_num_seqs"
        ),
        "requests: [{arrival_ms: 0, prompt: 0, output: 2}]\npolicies: [{policy: none}]\n": "prompt",
        "requests: [{arrival_ms: 0, prompt: 10, output: 2}]\npolicies: [{policy: none}]\nanimate: [none, x]\n": "x",
    }
    for body, word in cases.items():
        path.write_text(base + body)
        with pytest.raises(ValueError, match=word):
            load_scenario(path)
    with pytest.raises(ValueError, match="not a built-in scenario"):
        pick_scenarios(["no-such"])


def test_a_teachers_own_scenario_runs(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(
        "name: mine\ntitle: {en: Mine, ko: 나의 예}\nrequests:\n  - {arrival_ms: 0, prompt: 64, output: 3}\n"
        "  - {arrival_ms: 1, prompt: 64, output: 2}\npolicies:\n  - {policy: continuous, max_num_seqs: 2}\n"
    )
    (scenario,) = pick_scenarios([str(path)], hardware="a100-80g")
    assert isinstance(scenario, Scenario) and scenario.hardware == "a100-80g"
    (run,) = run_scenario(scenario)
    assert run.requests.output_tokens.tolist() == [3, 2]


def test_korean_without_a_font_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(style.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(style.font_manager.fontManager, "ttflist", [])
    with pytest.raises(ValueError, match="koreanize-matplotlib|fonts-nanum"):
        style.korean_font()


# ---- the figures ------------------------------------------------------------------------------------------------


def colours(path: Path) -> set[tuple[int, int, int]]:
    image = Image.open(path).convert("RGB")
    found = image.getcolors(maxcolors=1 << 22)
    assert found is not None
    return {c for _, c in found}


def rgb(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))  # type: ignore[return-value]


@pytest.fixture(scope="module", params=["en", "ko"])
def book(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp(f"teach-{request.param}")
    assert main(["teach", "--out", str(out), "--lang", request.param]) == 0
    return out, json.loads((out / "teach.json").read_text())


def test_every_figure_is_written_and_shows_something(book) -> None:
    out, index = book
    names = set(index["files"])
    expected = {"why-batching.png", "why-batching.svg", "limits.png", "limits.svg", "dock-boats.gif"}
    for scenario in builtin_scenarios():
        stems = [f"{scenario.name}-timeline-{label}" for label in scenario.labels()]
        stems += [f"{scenario.name}-timelines", f"{scenario.name}-ferry", f"{scenario.name}-scoreboard"]
        expected |= {f"{s}.{ext}" for s in stems for ext in ("png", "svg")}
        for label in scenario.labels():
            expected |= {f"records/{scenario.name}/{label}/{f}" for f in ("requests.csv", "iterations.csv",
                                                                             "batches.csv")}  # fmt: skip
    assert expected <= names
    for name in names:
        path = out / name
        assert path.is_file() and path.stat().st_size > 0, name
        if name.endswith(".png"):
            with Image.open(path) as image:
                assert image.width >= 1200 and image.height >= 300, (name, image.size)
            assert path.stat().st_size > 20_000, name
            assert len(colours(path)) >= 8, name
        elif name.endswith(".svg"):
            assert path.read_text().lstrip().startswith("<?xml") and "<path" in path.read_text()
    assert index["lang"] in ("en", "ko")


def test_figures_show_the_colours_of_what_happened(book) -> None:
    out, _ = book
    held, stalled, chunk = rgb(style.COLORS["held"]), rgb(style.COLORS["stalled"]), rgb(style.COLORS["prefill_chunk"])
    assert held in colours(out / "refill-timeline-static.png")
    assert held not in colours(out / "refill-timeline-continuous.png")
    assert stalled in colours(out / "prefill-priority-timeline-continuous.png")
    assert chunk in colours(out / "chunked-prefill-timeline-chunked.png")
    assert chunk not in colours(out / "chunked-prefill-timeline-continuous.png")
    assert rgb(style.COLORS["idle"]) in colours(out / "dock-timeline-static.png")  # it waits 30 ms for a full boat


def test_the_index_carries_the_numbers_to_point_at(book, runs) -> None:
    _, index = book
    facts = index["scenarios"]["refill"]["policies"]
    assert facts["continuous"]["first_iteration"]["4"] == runs["refill"]["continuous"].admitted_in("4")
    assert facts["static"]["seat_ms"]["held"] == pytest.approx(runs["refill"]["static"].seat_ms()["held"])
    assert index["scenarios"]["chunked-prefill"]["figures"] == ["6-9"]


def test_the_boats_gif_has_a_frame_per_iteration_start(book, runs) -> None:
    out, _ = book
    pair = [runs["dock"]["dynamic"], runs["dock"]["continuous"]]
    with Image.open(out / "dock-boats.gif") as gif:
        assert gif.n_frames == len(frame_times(pair))
        first = np.asarray(gif.convert("RGB"))
        gif.seek(gif.n_frames // 2)
        middle = np.asarray(gif.convert("RGB"))
    assert (first != middle).any()


def test_teach_refuses_another_commands_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "summary.json").write_text("{}")
    assert main(["teach", "--out", str(tmp_path), "--scenario", "aligned"]) == 2
    assert "another command's outputs" in capsys.readouterr().err


def test_a_second_teach_replaces_the_first_and_leaves_nothing_stale(tmp_path: Path) -> None:
    assert main(["teach", "--out", str(tmp_path), "--scenario", "aligned"]) == 0
    assert (tmp_path / "aligned-timelines.png").is_file()
    (tmp_path / "my-notes.txt").write_text("a teacher's file")
    assert main(["teach", "--out", str(tmp_path), "--scenario", "chunked-prefill"]) == 0
    assert not list(tmp_path.glob("aligned-*")) and not (tmp_path / "records" / "aligned").exists()
    assert (tmp_path / "chunked-prefill-timelines.png").is_file() and (tmp_path / "my-notes.txt").is_file()


def test_the_two_other_figures_take_their_settings_from_a_file(tmp_path: Path) -> None:
    mine = tmp_path / "figures.yaml"
    mine.write_text("limits:\n  max_num_seqs: 2\n  requests: [[1000, 500], [800, 200], [300, 100]]\n")
    settings = load_settings(mine, model="llama-3-70b")
    assert settings.limits.max_num_seqs == 2 and settings.limits.max_model_len == 4096  # the rest from figures.yaml
    assert settings.why_batching.model == "llama-3-70b"
    out = tmp_path / "out"
    assert main(["teach", "--out", str(out), "--scenario", "aligned", "--figures", str(mine)]) == 0
    index = json.loads((out / "teach.json").read_text())
    assert index["figures"]["limits"]["requests"] == [[1000, 500], [800, 200], [300, 100]]
    mine.write_text("limits:\n  max_num_seqs: 0\n")
    with pytest.raises(ValueError, match="max_num_seqs"):
        load_settings(mine)
    mine.write_text("limits:\n  seats: 3\n")
    with pytest.raises(ValueError, match="seats"):
        load_settings(mine)
