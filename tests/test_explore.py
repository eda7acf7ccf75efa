"""`ferry explore` without a browser: the JSON of a setting equals `ferry run`'s records for it, bad settings are
refused with the control they belong to, the page and its files are served over real HTTP from the package alone."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pytest

pytest.importorskip("starlette")
with warnings.catch_warnings():  # newer Starlette prefers httpx2 under its test client; httpx is what ferry has
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from experiments.cli import main as ferry  # noqa: E402
from experiments.explore.app import STATIC, build_app  # noqa: E402
from experiments.explore.payload import KEYS, Explorer, Settings  # noqa: E402
from experiments.teach.scenario import pick_scenarios  # noqa: E402
from tests.helpers import serving  # noqa: E402

CASES = {  # query string of the page -> the same settings as `ferry run` flags
    "dynamic": (
        {"policy": "dynamic", "max_batch_size": "4", "max_delay_ms": "200"},
        ["--policy", "dynamic", "--max-batch-size", "4", "--max-delay-ms", "200"],
    ),
    "chunked": (
        {
            "policy": "chunked",
            "max_num_seqs": "6",
            "max_num_batched_tokens": "256",
            "num_prompts": "30",
            "request_rate": "80",
            "input_len": "uniform:100:900",
            "seed": "3",
        },
        [
            "--policy",
            "chunked",
            "--max-num-seqs",
            "6",
            "--max-num-batched-tokens",
            "256",
            "--num-prompts",
            "30",
            "--request-rate",
            "80",
            "--input-len",
            "uniform:100:900",
            "--seed",
            "3",
        ],
    ),  # fmt: skip
    "continuous-mixed": (
        {"policy": "continuous", "max_num_seqs": "3", "mix_prefill_decode": "true", "hardware": "a100-80g"},
        ["--policy", "continuous", "--max-num-seqs", "3", "--mix-prefill-decode", "--hardware", "a100-80g"],
    ),
}
# the page's defaults as flags (what a query string leaves out)
DEFAULT_FLAGS = ["--model", "llama-3-8b", "--hardware", "h100-sxm", "--max-model-len", "4096", "--num-prompts", "12",
                 "--request-rate", "40", "--input-len", "uniform:64:512", "--output-len", "uniform:8:32", "--seed", "0",
                 "--max-num-batched-tokens", "4096"]  # fmt: skip


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(build_app(Explorer()))


def _flags(flags: list[str], policy: str) -> list[str]:
    """The defaults' flags under the case's own, leaving out the limits the policy does not read."""
    given = dict(zip(flags[::2], flags[1::2], strict=False))
    out = []
    for name, value in zip(DEFAULT_FLAGS[::2], DEFAULT_FLAGS[1::2], strict=True):
        if name == "--max-num-batched-tokens" and policy not in ("continuous", "chunked"):
            continue
        if name not in given:
            out += [name, value]
    return out + flags


@pytest.mark.parametrize("case", list(CASES))
def test_the_json_of_a_setting_is_ferry_runs_records(case: str, client: TestClient, tmp_path: Path) -> None:
    query, flags = CASES[case]
    got = client.get("/api/run", params=query)
    assert got.status_code == 200, got.text
    page = got.json()
    assert ferry(["run", *_flags(flags, query["policy"]), "--record-batches", "--out", str(tmp_path)]) == 0
    requests = pd.read_csv(tmp_path / "requests.csv", dtype={"request_id": str}).set_index("request_id")
    iterations = pd.read_csv(tmp_path / "iterations.csv")
    batches = pd.read_csv(tmp_path / "batches.csv", dtype={"request_id": str})

    drawn = pd.DataFrame(page["requests"]).set_index("id")
    assert list(drawn.index) == list(requests.index)
    for mine, theirs in (("arrival_ms", "arrival_s"), ("first_token_ms", "first_token_s"), ("finish_ms", "finish_s")):
        np.testing.assert_allclose(drawn[mine].astype(float), requests[theirs] * 1e3, rtol=1e-12, atol=1e-9)
    assert (drawn.prompt == requests.prompt_tokens).all()

    its = pd.DataFrame(page["iterations"])
    assert len(its) == len(iterations)
    np.testing.assert_allclose(its.start_ms, iterations.start * 1e3, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(its.end_ms, iterations.end * 1e3, rtol=1e-12, atol=1e-9)
    assert (its.prefill_tokens == iterations.prefill_tokens).all()

    spans = pd.DataFrame(page["spans"])
    computed = spans[spans.kind.isin(["prefill", "prefill_chunk", "decode"])]
    mine = sorted(zip(computed.iteration - 1, computed.request, computed.kind, computed.tokens, strict=True))
    theirs = sorted(zip(batches.iteration, batches.request_id, batches.phase, batches.tokens, strict=True))
    assert mine == theirs  # who rode in which iteration, doing what, with how many tokens

    summary = pd.read_json(tmp_path / "summary.json", typ="series")
    assert page["metrics"]["ttft_mean_ms"] == pytest.approx(summary["mean_ttft_ms"], rel=1e-12)
    assert page["metrics"]["output_throughput"] == pytest.approx(summary["output_throughput"], rel=1e-12)
    assert page["metrics"]["gpu_idle_ms"] == pytest.approx(summary["gpu_idle_s"] * 1e3, rel=1e-12)
    idle = sum(b - a for a, b in page["idle"])  # the shaded stretches are the idle time counted
    assert idle == pytest.approx(page["metrics"]["gpu_idle_ms"], rel=1e-9, abs=1e-9)


def test_every_drawn_box_sits_in_a_seat_the_policy_offers(client: TestClient) -> None:
    page = client.get("/api/run", params={"policy": "continuous", "max_num_seqs": "3", "num_prompts": "20"}).json()
    assert page["seats"] == 3
    seated = [s for s in page["spans"] if s["kind"] != "waiting"]
    assert seated and all(0 <= s["seat"] < 3 for s in seated)
    by_seat: dict[int, list[tuple[float, float]]] = {}
    for s in seated:  # two requests never share a seat at the same time
        by_seat.setdefault(s["seat"], []).append((s["start_ms"], s["end_ms"], s["request"]))
    for spans in by_seat.values():
        spans.sort()
        for (_, a1, ra), (b0, _, rb) in zip(spans, spans[1:], strict=False):
            assert ra == rb or b0 >= a1 - 1e-9


@pytest.mark.parametrize(
    ("query", "field", "words"),
    [
        ({"max_num_seqs": "x"}, "max_num_seqs", "whole number"),
        ({"max_delay_ms": "-5"}, "max_delay_ms", "greater than or equal"),
        ({"policy": "continuous", "max_num_batched_tokens": "256"}, "max_num_batched_tokens", "smaller than"),
        ({"model": "llama-3-70b", "hardware": "l40s"}, "model", "does not fit"),
        ({"input_len": "uniform:10:5"}, "input_len", "low=10"),
        ({"input_len": "8000"}, "max_model_len", "rejected"),
        ({"output_len": "empirical:/etc/passwd:x"}, "output_len", "not a file"),
        ({"num_prompts": "100000"}, "num_prompts", "less than or equal"),
        ({"model": "../../etc/passwd"}, "model", "choose one of"),
        ({"policy": "fifo"}, "policy", "policy"),
        ({"workload": "scenario"}, "workload", "--scenario"),
        ({"bogus": "1"}, None, "not a setting"),
    ],
)
def test_bad_settings_name_their_control(client: TestClient, query: dict[str, str], field: str, words: str) -> None:
    got = client.get("/api/run", params=query)
    assert got.status_code == 422
    error = got.json()["error"]
    assert error["field"] == field and words in error["message"], error
    assert "Traceback" not in got.text and "\n" not in error["message"]


def test_the_query_string_holds_every_setting() -> None:
    explorer = Explorer()
    settings = explorer.parse({"policy": "chunked", "max_num_batched_tokens": "512", "mix_prefill_decode": "true"})
    query = explorer.query(settings)
    assert query == "policy=chunked&max_num_batched_tokens=512&mix_prefill_decode=true"
    assert explorer.parse(dict(pair.split("=") for pair in query.split("&"))) == settings
    assert explorer.query(explorer.defaults) == ""


def test_a_scenario_gives_the_defaults_and_its_requests(client: TestClient) -> None:
    scenario = pick_scenarios(["refill"])[0]
    explorer = Explorer.of_scenario(scenario)
    assert explorer.defaults.workload == "scenario" and explorer.defaults.policy == scenario.policies[0]["policy"]
    page = TestClient(build_app(explorer)).get("/api/run").json()
    assert [r["prompt"] for r in page["requests"]] == [r.prompt for r in scenario.requests]
    assert [r["arrival_ms"] for r in page["requests"]] == pytest.approx([r.arrival_ms for r in scenario.requests])
    options = TestClient(build_app(explorer)).get("/api/options", params={"lang": "ko"}).json()
    assert scenario.title.ko in options["title"]


def test_options_cover_every_control_in_both_languages(client: TestClient) -> None:
    for lang in ("en", "ko"):
        options = client.get("/api/options", params={"lang": lang}).json()
        assert [c["key"] for c in options["controls"]] == list(KEYS)
        assert options["defaults"] == Settings().model_dump()
        assert sorted(k for g in options["groups"] for k in g["keys"]) == sorted(KEYS)
    ko = client.get("/api/options", params={"lang": "ko"}).json()
    assert ko["words"]["decode"] == "디코드"
    assert client.get("/api/options", params={"lang": "fr"}).status_code == 422


def test_the_page_needs_nothing_from_elsewhere() -> None:
    files = sorted(STATIC.iterdir())
    assert {f.name for f in files} >= {"index.html", "explore.js", "explore.css"}
    for f in files:
        text = f.read_text(encoding="utf-8")
        remote = re.findall(r"""(?:src|href|url|import|fetch)\s*\(?\s*['"]?\s*(?:https?:)?//""", text)
        assert not remote, f"{f.name} loads {remote}"


def test_the_server_answers_over_http(tmp_path: Path) -> None:
    with serving([], tmp_path / "stderr.txt", command="explore") as (proc, url):
        page = httpx.get(url, timeout=30)
        assert page.status_code == 200 and "/static/explore.js" in page.text
        assert httpx.get(url + "static/explore.js", timeout=30).status_code == 200
        got = httpx.get(url + "api/run", params={"policy": "static", "max_batch_size": "3"}, timeout=60)
        assert got.status_code == 200 and got.json()["seats"] == 3
        bad = httpx.get(url + "api/run", params={"max_batch_size": "0"}, timeout=30)
        assert bad.status_code == 422 and bad.json()["error"]["field"] == "max_batch_size"
        assert proc.poll() is None  # still serving after a bad request


def test_every_scenario_opens_and_each_policy_runs_with_its_own_limits() -> None:
    """A scenario whose policies have limits of their own (chunked prefill's budget of 513 tokens, which continuous
    batching cannot run with at its max_model_len) opens on its first policy's, and a policy chosen on the page runs
    with the scenario's limits for it."""
    from experiments.teach.scenario import builtin_scenarios

    for scenario in builtin_scenarios():
        explorer = Explorer.of_scenario(scenario)
        for entry in scenario.policies:
            settings = explorer.defaults.model_copy(update={"policy": entry.get("policy", "continuous")})
            config = explorer.run_config(settings)
            for key in ("max_num_seqs", "max_num_batched_tokens", "max_batch_size"):
                if key in entry:
                    assert getattr(config.scheduler, key) == entry[key], (scenario.name, entry, key)
