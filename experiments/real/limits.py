"""What a live server says of its own limits, read where it states them; never guessed.

Two scheduler limits decide what ``ferry probe`` may time as one iteration and how many requests decode together:
``max_num_batched_tokens`` (tokens an iteration computes) and ``max_num_seqs`` (requests seated at once). Where
each OpenAI-compatible server states them:

- ``ferry serve``: on its ``GET /v1/models`` card, beside ``max_model_len``.
- ``vllm serve`` (read from vLLM 0.32.0's API server): its card states only ``max_model_len``. Its ``/metrics`` has
  one info gauge of its configuration, ``vllm:cache_config_info``, whose labels are the KV cache's settings
  (``block_size``, ``num_gpu_blocks``, ``enable_prefix_caching``, ...), none of the scheduler's; no gauge of
  ``/metrics`` carries either limit. The whole configuration (``scheduler_config.max_num_batched_tokens``,
  ``max_num_seqs``) is at ``GET /server_info?config_format=json`` (server root, not ``/v1``), which vLLM serves
  only with its development endpoints on (``VLLM_SERVER_DEV_MODE=1`` in the server's environment).
- ``llama-server`` (llama.cpp, read from the one llama-cpp-python 0.3.36 vendors: ``tools/server/server-context.cpp``,
  ``get_res_props``): ``GET /props`` (server root) states ``total_slots``, its ``--parallel``: requests seated at
  once. Its batch size (``--batch-size``, ``n_batch``: the tokens one iteration takes, decodes and prompt chunks
  together) is stated nowhere: not at ``/props``, ``/slots``, ``/v1/models`` (whose ``meta`` has ``n_ctx``) nor
  ``/metrics``.

``read_limits`` asks the card first, then ``/server_info``, then ``/props``, then ``/metrics`` (for the KV cache); a
limit no answer states stays None, and the caller says so.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

SCHEDULER = ("max_num_batched_tokens", "max_num_seqs")  # tokens per iteration, sequences seated at once
CACHE = ("block_size", "num_gpu_blocks")  # tokens per KV block, KV blocks
ASK_TIMEOUT_S = 10.0  # the longest wait for /server_info or /metrics (s): either answers at once, or not at all
_INFO = re.compile(r"^vllm:cache_config_info\{(?P<labels>.*)\}\s+\S+\s*$", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass
class ServerLimits:
    """The limits a server stated (None: not stated), and where each was read."""

    max_num_batched_tokens: int | None = None  # tokens one iteration computes at most
    max_num_seqs: int | None = None  # requests seated (prefilling or decoding) at once
    block_size: int | None = None  # tokens per KV-cache block
    num_gpu_blocks: int | None = None  # KV-cache blocks (vLLM's name, on a CPU too)
    sources: dict[str, str] = field(default_factory=dict)  # limit -> where it was read

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in (*SCHEDULER, *CACHE)} | {"sources": dict(self.sources)}

    def take(self, values: dict[str, Any], where: str) -> None:
        """Keep each positive integer of ``values`` for a limit not yet known, noting ``where`` it came from."""
        for key in (*SCHEDULER, *CACHE):
            value = _positive(values.get(key))
            if value is not None and getattr(self, key) is None:
                setattr(self, key, value)
                self.sources[key] = where

    def unknown_note(self) -> str | None:
        """Where vLLM states the scheduler limits, when the server stated one of them nowhere (else None)."""
        missing = [k for k in SCHEDULER if getattr(self, k) is None]
        if not missing:
            return None
        if self.sources.get("max_num_seqs", "").endswith("/props"):  # llama-server
            return (
                f"ferry does not guess {' or '.join(missing)} (llama-server states its slots at /props, total_slots, "
                "but its batch size, --batch-size, nowhere)"
            )
        return (
            f"ferry does not guess {' or '.join(missing)} (vLLM states them only at /server_info, served with "
            "VLLM_SERVER_DEV_MODE=1; its /v1/models and /metrics do not)"
        )


def _positive(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    return value if isinstance(value, int) and value > 0 else None


def server_root(base_url: str) -> str:
    """``http://HOST:PORT`` of an OpenAI base URL (``http://HOST:PORT/v1``): where /server_info and /metrics are."""
    parts = urllib.parse.urlsplit(base_url)
    path = parts.path.rstrip("/")
    path = path[: -len("/v1")] if path.endswith("/v1") else path
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def from_server_info(payload: Any) -> dict[str, Any]:
    """The limits in vLLM's ``/server_info?config_format=json`` answer (``{"vllm_config": {...}}``), else {}."""
    config = payload.get("vllm_config") if isinstance(payload, dict) else None
    if not isinstance(config, dict):
        return {}
    scheduler = config.get("scheduler_config")
    cache = config.get("cache_config")
    out: dict[str, Any] = {}
    if isinstance(scheduler, dict):
        out |= {k: scheduler.get(k) for k in SCHEDULER}
    if isinstance(cache, dict):
        out |= {k: cache.get(k) for k in CACHE}
    return out


def from_props(payload: Any) -> dict[str, Any]:
    """The limits in llama-server's ``/props`` answer (``total_slots``: its ``--parallel``), else {}."""
    if not isinstance(payload, dict) or "total_slots" not in payload:
        return {}
    return {"max_num_seqs": payload["total_slots"]}


def from_metrics(text: str) -> dict[str, Any]:
    """The KV cache's settings in a ``/metrics`` exposition's ``vllm:cache_config_info`` labels, else {}."""
    found = _INFO.search(text)
    if found is None:
        return {}
    labels = dict(_LABEL.findall(found.group("labels")))
    return {k: labels.get(k) for k in CACHE}


async def _get(client: Any, url: str, timeout_s: float) -> Any:
    """``url``'s answer when it is HTTP 200, else None (a server that does not have the endpoint)."""
    import httpx

    try:
        r = await client.get(url, timeout=timeout_s)
    except (httpx.HTTPError, httpx.StreamError, OSError):
        return None
    return r if r.status_code == 200 else None


async def read_limits(
    client: Any, base_url: str, card: dict[str, Any], timeout_s: float = ASK_TIMEOUT_S
) -> ServerLimits:
    """The limits ``base_url``'s server states: on ``card`` (its ``/models`` entry), at ``/server_info``, at
    ``/props``, in ``/metrics`` (in that order, the first answer kept); each wait at most ``timeout_s`` seconds.
    Never raises for a server without those endpoints: what it does not state stays None."""
    limits = ServerLimits()
    limits.take(card, f"{base_url}/models")
    root = server_root(base_url)
    if any(getattr(limits, k) is None for k in (*SCHEDULER, *CACHE)):
        where = f"{root}/server_info"
        r = await _get(client, f"{where}?config_format=json", timeout_s)
        if r is not None:
            try:
                limits.take(from_server_info(r.json()), where)
            except ValueError:
                pass
    if limits.max_num_seqs is None:
        where = f"{root}/props"
        r = await _get(client, where, timeout_s)
        if r is not None:
            try:
                limits.take(from_props(r.json()), where)
            except ValueError:
                pass
    if any(getattr(limits, k) is None for k in CACHE):
        r = await _get(client, f"{root}/metrics", timeout_s)
        if r is not None:
            limits.take(from_metrics(r.text), f"{root}/metrics (vllm:cache_config_info)")
    return limits
