"""The parts of `ferry probe` and `ferry validate --url` that read a live server, on answers written here: the limits
a server states (`experiments.real.limits`: vLLM's `/server_info` and `/metrics` as vLLM 0.32.0 writes them), a
response that came in one burst (`client.held_back`), the request handling a client waits beyond its simulated
TTFT (`validate_url.handling_of`), and the probe's check of its fit on the gaps it was fitted on."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pandas as pd
import pytest

from costmodel import load_hardware
from costmodel.hardware import HardwareProfile
from experiments.commands.validate_url import limit_mismatches
from experiments.real.client import Stream, held_back
from experiments.real.handling import handling_of, measured_handling, measured_wake
from experiments.real.limits import ServerLimits, from_metrics, from_server_info, read_limits, server_root
from experiments.real.probe import ProbeRun, idle_handling

SERVER_INFO = {
    "vllm_config": {
        "scheduler_config": {"max_num_batched_tokens": 256, "max_num_seqs": 32, "policy": "fcfs"},
        "cache_config": {"block_size": 32, "num_gpu_blocks": 16384, "enable_prefix_caching": True},
    }
}
METRICS = """# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="32",cache_dtype="auto",enable_prefix_caching="True",num_gpu_blocks="16384"} 1.0
vllm:num_requests_running{engine="0",model_name="m"} 0.0
"""


def test_server_info_and_metrics_are_read_as_vllm_writes_them() -> None:
    assert from_server_info(SERVER_INFO) == {
        "max_num_batched_tokens": 256, "max_num_seqs": 32, "block_size": 32, "num_gpu_blocks": 16384,
    }  # fmt: skip
    assert from_server_info({"vllm_config": "not a dict"}) == {} and from_server_info([1, 2]) == {}
    assert from_metrics(METRICS) == {"block_size": "32", "num_gpu_blocks": "16384"}
    assert from_metrics("vllm:num_requests_running 0.0\n") == {}
    assert server_root("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000"
    assert server_root("http://h:1/prefix/v1/") == "http://h:1/prefix"


def _serve(routes: dict[str, httpx.Response]) -> httpx.AsyncClient:
    def answer(request: httpx.Request) -> httpx.Response:
        return routes.get(request.url.path, httpx.Response(404, text="not found"))

    return httpx.AsyncClient(transport=httpx.MockTransport(answer))


def _limits(routes: dict[str, httpx.Response], card: dict) -> ServerLimits:
    async def go() -> ServerLimits:
        async with _serve(routes) as client:
            return await read_limits(client, "http://srv:8000/v1", card)

    return asyncio.run(go())


def test_limits_come_from_the_card_then_server_info_then_metrics_and_are_never_guessed() -> None:
    # vLLM with its development endpoints: /server_info states all four
    got = _limits({"/server_info": httpx.Response(200, json=SERVER_INFO)}, {"id": "m", "max_model_len": 4096})
    assert (got.max_num_batched_tokens, got.max_num_seqs, got.block_size) == (256, 32, 32)
    assert got.sources["max_num_seqs"] == "http://srv:8000/server_info" and got.unknown_note() is None
    # a card that states them wins (ferry serve's)
    got = _limits({"/server_info": httpx.Response(200, json=SERVER_INFO)}, {"max_num_batched_tokens": 512})
    assert got.max_num_batched_tokens == 512 and got.max_num_seqs == 32
    # vLLM as it runs by default: no /server_info, /metrics has the cache only; the scheduler limits stay unknown
    got = _limits({"/metrics": httpx.Response(200, text=METRICS)}, {"id": "m"})
    assert (got.max_num_batched_tokens, got.max_num_seqs, got.block_size) == (None, None, 32)
    note = got.unknown_note()
    assert note is not None and "max_num_batched_tokens or max_num_seqs" in note and "VLLM_SERVER_DEV_MODE=1" in note
    # nonsense is not a limit
    bad = {"vllm_config": {"scheduler_config": {"max_num_seqs": -3, "max_num_batched_tokens": True}}}
    got = _limits({"/server_info": httpx.Response(200, json=bad)}, {"max_num_seqs": "many"})
    assert got.max_num_seqs is None and got.max_num_batched_tokens is None


def _stream(gaps_ms: list[float]) -> Stream:
    s = Stream(0.0, 10, len(gaps_ms) + 1)
    s.chunk_s = list(0.05 + np.concatenate([[0.0], np.cumsum(gaps_ms)]) / 1e3)
    return s


def test_a_response_that_came_in_one_burst_is_told_from_a_streamed_one() -> None:
    assert held_back(_stream([0.01] * 20))  # 20 tokens within a fifth of a millisecond: held back, then sent
    assert not held_back(_stream([3.0] * 20))
    assert not held_back(_stream([0.01] * 8 + [3.0] * 12))  # a burst or two in a streamed response
    assert not held_back(_stream([0.01]))  # too short to tell


def test_handling_follows_the_loads_the_probe_measured_by_the_requests_in_flight() -> None:
    arrival = np.array([0.0, 1.0, 1.1, 1.2, 1.3, 5.0])
    finish = np.array([0.5, 2.0, 2.0, 2.0, 2.0, 6.0])
    # in flight at each arrival: 0, 0, 1, 2, 3, 0
    got = handling_of(arrival, finish, idle_s=0.004, busy=[(2, 0.010)])
    assert got == pytest.approx([0.004, 0.004, 0.007, 0.010, 0.010, 0.004])  # held at the heaviest beyond it
    got = handling_of(arrival, finish, idle_s=0.004, busy=[(1, 0.009), (3, 0.011)])
    assert got == pytest.approx([0.004, 0.004, 0.009, 0.010, 0.011, 0.004])


def test_a_request_that_finds_the_server_idle_waits_what_its_silence_measured() -> None:
    arrival = np.array([0.0, 1.0, 1.1, 1.2, 1.3, 5.0])
    finish = np.array([0.5, 2.0, 2.0, 2.0, 2.0, 6.0])
    # in flight at each arrival: 0, 0, 1, 2, 3, 0; silent before the idle ones: since before the run, 0.5 s, 3 s
    wake = [(0.1, 0.001), (1.0, 0.005)]
    got = handling_of(arrival, finish, idle_s=0.004, busy=[(2, 0.010)], wake=wake)
    between = 0.001 + (0.5 - 0.1) / (1.0 - 0.1) * 0.004  # 0.5 s: linear between the pauses measured
    assert got == pytest.approx([0.009, 0.004 + between, 0.007, 0.010, 0.010, 0.009])  # held beyond the last
    assert handling_of(arrival, finish, 0.004, [(2, 0.010)], wake=[]) == pytest.approx(
        handling_of(arrival, finish, 0.004, [(2, 0.010)])
    )


def _answered(sent: float, ttft: float) -> Stream:
    s = Stream(sent, 64, 1)
    s.chunk_s = [sent + ttft]
    return s


def test_the_idle_experiments_give_what_each_pause_adds_to_a_first_token() -> None:
    run = ProbeRun("http://x/v1", "m", None, False, [])
    assert idle_handling(run) == []  # not measured
    for k in range(3):
        t = 10.0 * k
        run.wake += [(0.0, _answered(t, 0.007)), (0.1, _answered(t + 1, 0.0075)),
                     (0.3, _answered(t + 2, 0.011 + 0.001 * k)), (1.0, _answered(t + 3, 0.006))]  # fmt: skip
    failed = Stream(50.0, 64, 1)
    failed.error = "HTTP 500"
    run.wake.append((1.0, failed))  # a failed request times nothing
    assert idle_handling(run) == [(0.1, pytest.approx(0.0005)), (0.3, pytest.approx(0.005)), (1.0, 0.0)]  # never < 0
    run.wake = [(p, s) for p, s in run.wake if p > 0]
    assert idle_handling(run) == []  # nothing sent awake to compare with


def _with_settings(settings: dict[str, str]) -> HardwareProfile:
    hw = load_hardware("a100-40g")
    return hw.model_copy(update={"provenance": hw.provenance.model_copy(update={"settings": settings})})


def test_handling_is_read_from_a_profiles_settings_old_and_new() -> None:
    assert measured_handling(_with_settings({})) == (0.0, [])
    assert measured_handling(_with_settings({"client_s": "0.004"})) == (0.004, [])
    old = {"client_s": "0.004", "client_busy_s": "0.01", "client_busy_seqs": "16"}  # one load: profiles before
    assert measured_handling(_with_settings(old)) == (0.004, [(16, 0.01)])
    new = {"client_s": "0.004", "client_busy_s": "0.012,0.009", "client_busy_seqs": "16,2"}
    assert measured_handling(_with_settings(new)) == (0.004, [(2, 0.009), (16, 0.012)])
    bad_ones = (
        {"client_busy_s": "0.01,x", "client_busy_seqs": "2,16"},
        {"client_busy_s": "0.01", "client_busy_seqs": "2,16"},
        {"client_busy_s": "0.01", "client_busy_seqs": "0"},
    )
    for bad in bad_ones:
        with pytest.raises(ValueError, match="client_busy_s") as err:
            measured_handling(_with_settings(bad))
        assert "\n" not in str(err.value)
    assert measured_wake(_with_settings(new)) == []
    idle = {"client_idle_s": "0.001,0.004", "client_idle_after_s": "0.1,1"}
    assert measured_wake(_with_settings(idle)) == [(0.1, 0.001), (1.0, 0.004)]
    for bad in ({"client_idle_s": "0.001"}, {"client_idle_s": "0.001,x", "client_idle_after_s": "0.1,1"},
                {"client_idle_s": "0.001,0.004", "client_idle_after_s": "1,0.1"},
                {"client_idle_s": "-1", "client_idle_after_s": "0.1"}):  # fmt: skip
        with pytest.raises(ValueError, match="client_idle_s") as err:
            measured_wake(_with_settings(bad))
        assert "\n" not in str(err.value)


def test_a_limit_the_server_states_differently_is_said() -> None:
    told = ServerLimits(max_num_batched_tokens=256, max_num_seqs=32)
    assert limit_mismatches(told, 32, 256) == []
    (line,) = limit_mismatches(told, 64, 256)
    assert "max_num_seqs 32" in line and "--max-num-seqs" in line
    assert limit_mismatches(ServerLimits(), 64, 256) == []  # not stated: nothing to say


def test_the_fit_is_checked_on_the_gaps_it_was_fitted_on() -> None:
    from experiments.real.probe_report import GAP_CHECK_MIN, host_check

    class Overheads:
        class _Q:
            def __init__(self, v: float) -> None:
                self.value = v

        per_iteration_s, per_sequence_s, per_prefill_s = _Q(0.003), _Q(0.0001), None

    class Fit:
        class profile:  # noqa: N801
            overheads = Overheads

    n = GAP_CHECK_MIN + 4
    rows = pd.DataFrame({"kind": ["decode"] * n, "held_out": [False] * n, "measured_s": [0.0035] * n})
    good, notes = host_check(Fit, rows.assign(predicted_s=0.0036))  # type: ignore[arg-type]
    assert notes == [] and good["host_share_of_decode_step"] == pytest.approx(0.003 / 0.0035)
    _, notes = host_check(Fit, rows.assign(predicted_s=0.0011), held_back=3)  # type: ignore[arg-type]
    (warning,) = notes
    assert "not to be trusted" in warning and f"{n} token gaps" in warning
    _, notes = host_check(Fit, rows.head(2).assign(predicted_s=0.0035), held_back=3)  # type: ignore[arg-type]
    (warning,) = notes
    assert "barely measured" in warning and "held back 3" in warning
