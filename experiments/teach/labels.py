"""Every word the teaching figures print, in English and Korean (the chapter's terms: 프리필, 디코드, 정적·동적·연속
배치, 청크 분할 프리필, 최대 배치 크기 ...). A figure asks ``text(key, lang)``; a missing key is a KeyError, so a
figure cannot print an untranslated label by accident."""

from __future__ import annotations

LANGS = ("en", "ko")

LABELS: dict[str, tuple[str, str]] = {
    # policies
    "none": ("no batching", "배치 없음"),
    "static": ("static batching", "정적 배치"),
    "dynamic": ("dynamic batching", "동적 배치"),
    "continuous": ("continuous batching", "연속 배치"),
    "continuous-mixed": ("continuous, prefill and decode mixed", "연속 배치 (프리필·디코드 혼합)"),
    "chunked": ("continuous + chunked prefill", "연속 배치 + 청크 분할 프리필"),
    # what a request is doing
    "prefill": ("prefill", "프리필"),
    "prefill_chunk": ("prefill chunk", "프리필 청크"),
    "decode": ("decode", "디코드"),
    "waiting": ("waiting in the queue", "대기열에서 대기"),
    "held": ("finished, seat still held", "완료했지만 좌석 점유"),
    "stalled": ("in the batch, not computing", "배치 안에서 유휴"),
    "arrival": ("arrival", "도착"),
    # the same, in a boat's seat (short)
    "seat_prefill": ("prefill", "프리필"),
    "seat_prefill_chunk": ("prefill chunk", "청크 프리필"),
    "seat_decode": ("decode", "디코드"),
    "seat_stalled": ("sits out", "유휴"),
    "seat_held": ("done, holds seat", "완료·자리 점유"),
    "first_token": ("first token", "첫 토큰"),
    # axes and words
    "time_ms": ("time (ms)", "시간 (ms)"),
    "request": ("request", "요청"),
    "iteration": ("iteration", "반복"),
    "seats": ("seats", "좌석"),
    "seat": ("seat", "좌석"),
    "occupied": ("seat occupied (computing)", "좌석 사용 (연산 중)"),
    "empty": ("seat empty", "빈 좌석"),
    "dock": ("dock queue", "선착장 대기열"),
    "gpu_idle": ("GPU idle", "GPU 유휴"),
    "idle_s": ("GPU idle {ms:.0f} ms", "GPU 유휴 {ms:.0f} ms"),
    "held_s": ("seats held after finishing {ms:.0f} seat-ms", "완료 후 점유된 좌석 {ms:.0f} 좌석-ms"),
    "empty_s": ("empty seats {ms:.0f} seat-ms", "빈 좌석 {ms:.0f} 좌석-ms"),
    "max_batch_size": ("max batch size", "최대 배치 크기"),
    "max_delay": ("max delay", "최대 대기 시간"),
    "max_num_seqs": ("max num seqs", "최대 시퀀스 수"),
    "max_num_batched_tokens": ("max batched tokens", "최대 배치 토큰 수"),
    "max_model_len": ("max model length", "최대 모델 길이"),
    "chunk": ("chunk", "청크"),
    # scoreboard
    "policy": ("policy", "정책"),
    "ttft": ("TTFT mean (ms)", "TTFT 평균 (ms)"),
    "itl": ("ITL mean (ms)", "ITL 평균 (ms)"),
    "e2el": ("E2E mean (ms)", "종단 간 평균 (ms)"),
    "throughput": ("output tok/s", "출력 토큰/s"),
    "idle": ("GPU idle (ms)", "GPU 유휴 (ms)"),
    "makespan": ("last response (ms)", "마지막 응답 (ms)"),
    "scoreboard": ("Scoreboard", "정책별 성적표"),
    "whole_note": (
        "Static and dynamic batching return each response whole when the batch ends (TTFT = E2E); ITL is between "
        "tokens as they are made.",
        "정적·동적 배치는 배치가 끝날 때 응답 전체를 돌려준다 (TTFT = 종단 간 지연). ITL은 토큰이 만들어진 간격이다.",
    ),
    "same_axis": ("same time axis for every policy", "모든 정책이 같은 시간 축"),
    "frame_time": ("t = {ms:.0f} ms", "t = {ms:.0f} ms"),
    "home": ("home (response delivered)", "집 (응답 전달 완료)"),
}


def text(key: str, lang: str, own: dict[str, tuple[str, str]] | None = None, **values: object) -> str:
    """The label ``key`` in ``lang`` (``en`` or ``ko``), with ``values`` filled into its ``{}`` fields; ``own``: a
    figure's own words, looked up before the shared ones."""
    if lang not in LANGS:
        raise ValueError(f"--lang {lang!r}: choose one of {', '.join(LANGS)}")
    words = (own if own is not None and key in own else LABELS)[key][LANGS.index(lang)]
    return words.format(**values) if values else words
