"""Every word `ferry explore`'s page prints, in English and Korean: the teaching figures' terms
(``experiments.teach.labels``) and the page's own. A missing key is a KeyError, as for the figures."""

from __future__ import annotations

from typing import Any

from experiments.teach.labels import LABELS, text

OWN: dict[str, tuple[str, str]] = {
    "title": ("ferry explore", "ferry explore (배치 탐색기)"),
    "group_policy": ("batching policy", "배치 정책"),
    "group_workload": ("requests", "요청"),
    "group_replica": ("model and GPU", "모델과 GPU"),
    "workload": ("requests from", "요청 출처"),
    "synthetic": ("drawn (rate, count, lengths)", "생성 (도착률, 개수, 길이)"),
    "scenario": ("the scenario's", "시나리오의 요청"),
    "long_prefill_token_threshold": ("long prefill threshold (chunk cap)", "긴 프리필 기준 (청크 상한)"),
    "mix_prefill_decode": ("mix prefill and decode", "프리필·디코드 혼합"),
    "request_rate": ("request rate", "요청 도착률"),
    "num_prompts": ("number of requests", "요청 수"),
    "input_len": ("prompt length", "프롬프트 길이"),
    "output_len": ("output length", "출력 길이"),
    "seed": ("seed", "시드"),
    "model": ("model", "모델"),
    "hardware": ("GPU", "GPU"),
    "max_delay_ms": ("max delay (ms)", "최대 대기 시간 (ms)"),
    "time_ms": ("time (ms)", "시간 (ms)"),
    "tokens": ("tokens", "토큰"),
    "before": ("before", "이전"),
    "after": ("after", "이후"),
    "change": ("change", "변화"),
    "busy": ("simulating...", "시뮬레이션 중..."),
    "metrics": ("metrics", "지표"),
    "timeline": ("requests over time", "요청별 타임라인"),
    "seats": ("the ferry: seats over time", "페리: 시간에 따른 좌석"),
    "shown_of": ("showing the first {n} of {total} requests", "요청 {total}개 중 처음 {n}개만 표시"),
    "reset_zoom": ("reset zoom", "확대 초기화"),
    "link": ("link to these settings", "이 설정의 링크"),
    "copied": ("link copied", "링크 복사됨"),
    "rejected": ("rejected", "거부됨"),
    "changed": ("changed", "바뀐 설정"),
    "unchanged": ("first run", "첫 실행"),
    "completed": ("completed", "완료"),
    "zoom_hint": ("wheel: zoom, drag: pan", "휠: 확대, 드래그: 이동"),
    "queue": ("waiting", "대기 중"),
    "iteration_n": ("iteration {n}", "반복 {n}"),
    "seat_n": ("seat {n}", "좌석 {n}"),
    "request_n": ("request {id}", "요청 {id}"),
    "whole_response": (
        "Static and dynamic batching return each response whole when its batch ends: TTFT = E2E, TPOT 0; ITL is "
        "between tokens as they are made.",
        "정적·동적 배치는 배치가 끝날 때 응답 전체를 돌려준다: TTFT = 종단 간 지연, TPOT 0. "
        "ITL은 토큰이 만들어진 간격이다.",
    ),
}

# a line under each control, and the units beside them
HELP: dict[str, tuple[str, str]] = {
    "workload": (
        "requests drawn from the settings below, or the scenario's own",
        "아래 설정으로 생성한 요청, 또는 시나리오의 요청",
    ),
    "policy": ("how requests are grouped into iterations", "요청을 반복(iteration)으로 묶는 방식"),
    "max_batch_size": ("static, dynamic: passengers per boat", "정적·동적: 배 한 척의 승객 수"),
    "max_delay_ms": (
        "dynamic: longest the first passenger waits for a fuller boat",
        "동적: 첫 승객이 배가 차기를 기다리는 최대 시간",
    ),
    "max_num_seqs": ("continuous, chunked: sequences in one iteration", "연속·청크: 한 반복의 시퀀스 수"),
    "max_num_batched_tokens": ("continuous, chunked: tokens in one iteration", "연속·청크: 한 반복의 토큰 수"),
    "long_prefill_token_threshold": (
        "chunked: largest chunk of one prompt (0: no cap)",
        "청크: 프롬프트 한 개의 최대 청크 (0: 제한 없음)",
    ),
    "mix_prefill_decode": (
        "continuous: prefills and decodes share an iteration",
        "연속: 프리필과 디코드가 한 반복을 공유",
    ),
    "request_rate": ("Poisson arrivals per second (inf: all at once)", "초당 포아송 도착 수 (inf: 한꺼번에)"),
    "num_prompts": ("at most 2,000", "최대 2,000"),
    "input_len": (
        "256, uniform:64:512, lognormal:median=512,sigma=1,max=4096",
        "256, uniform:64:512, lognormal:median=512,sigma=1,max=4096",
    ),
    "output_len": ("tokens each request generates (same forms)", "요청마다 생성하는 토큰 수 (같은 형식)"),
    "seed": ("same seed, same requests", "같은 시드, 같은 요청"),
    "model": ("a built-in model (config.json)", "내장 모델 (config.json)"),
    "hardware": ("a built-in GPU profile", "내장 GPU 프로필"),
    "max_model_len": ("longest prompt + output of one request", "요청 하나의 프롬프트 + 출력 최대 길이"),
}
UNITS: dict[str, tuple[str, str]] = {
    "requests": ("requests", "요청"),
    "sequences": ("sequences", "시퀀스"),
    "tokens": ("tokens", "토큰"),
    "ms": ("ms", "ms"),
    "req/s": ("req/s", "요청/s"),
}

# the metric panel's labels: (key, better, digits) -> words
METRIC_WORDS: dict[str, tuple[str, str, int, tuple[str, str]]] = {
    "ttft_mean_ms": ("lower", "ms", 1, ("TTFT mean", "TTFT 평균")),
    "ttft_p50_ms": ("lower", "ms", 1, ("TTFT p50", "TTFT p50")),
    "ttft_p90_ms": ("lower", "ms", 1, ("TTFT p90", "TTFT p90")),
    "ttft_p99_ms": ("lower", "ms", 1, ("TTFT p99", "TTFT p99")),
    "tpot_mean_ms": ("lower", "ms", 2, ("TPOT mean", "TPOT 평균")),
    "tpot_p90_ms": ("lower", "ms", 2, ("TPOT p90", "TPOT p90")),
    "itl_mean_ms": ("lower", "ms", 2, ("ITL mean", "ITL 평균")),
    "itl_p90_ms": ("lower", "ms", 2, ("ITL p90", "ITL p90")),
    "itl_p99_ms": ("lower", "ms", 2, ("ITL p99", "ITL p99")),
    "e2el_mean_ms": ("lower", "ms", 1, ("E2E mean", "종단 간 평균")),
    "e2el_p50_ms": ("lower", "ms", 1, ("E2E p50", "종단 간 p50")),
    "e2el_p90_ms": ("lower", "ms", 1, ("E2E p90", "종단 간 p90")),
    "e2el_p99_ms": ("lower", "ms", 1, ("E2E p99", "종단 간 p99")),
    "output_throughput": ("higher", "tok/s", 0, ("output throughput", "출력 처리량")),
    "request_throughput": ("higher", "req/s", 2, ("request throughput", "요청 처리량")),
    "gpu_idle_ms": ("lower", "ms", 1, ("GPU idle", "GPU 유휴")),
    "gpu_idle_percent": ("lower", "%", 1, ("GPU idle share", "GPU 유휴 비율")),
    "seat_utilization_percent": ("higher", "%", 1, ("seats in use", "좌석 사용률")),
    "mean_batch_size": ("higher", "seqs", 2, ("mean batch size", "평균 배치 크기")),
    "peak_kv_usage_percent": ("lower", "%", 2, ("KV cache peak", "KV 캐시 최대 사용률")),
    "mean_kv_usage_percent": ("lower", "%", 2, ("KV cache mean", "KV 캐시 평균 사용률")),
    "completed": ("higher", "", 0, ("completed", "완료")),
    "rejected": ("lower", "", 0, ("rejected", "거부")),
}

_KINDS = ("prefill", "prefill_chunk", "decode", "waiting", "stalled", "held", "arrival", "gpu_idle", "request",
          "iteration", "seat", "first_token", "dock", "none", "static", "dynamic", "continuous", "chunked")  # fmt: skip


def word(key: str, lang: str) -> str:
    """The page's word ``key`` in ``lang``: its own first, then the teaching figures'."""
    return text(key, lang, OWN)


def words(lang: str) -> dict[str, str]:
    """Every word the drawing prints, by key."""
    return {key: word(key, lang) for key in (*OWN, *_KINDS)}


def control_label(key: str, lang: str) -> str:
    """A control's label: the page's word for it, else the teaching figures' (max batch size, ...)."""
    return word(key, lang) if key in OWN or key in LABELS else key


def help_text(key: str, lang: str) -> str:
    return HELP[key][1 if lang == "ko" else 0]


def unit(name: str, lang: str) -> str:
    return UNITS[name][1 if lang == "ko" else 0]


def metric_label(key: str, lang: str) -> dict[str, Any]:
    better, unit, digits, names = METRIC_WORDS[key]
    name = names[1] if lang == "ko" else names[0]
    return {"key": key, "label": f"{name} ({unit})" if unit else name, "better": better, "digits": digits}
