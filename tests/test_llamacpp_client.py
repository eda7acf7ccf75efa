"""What ferry's probe and validate client read of llama.cpp's ``llama-server``, on answers written here as it writes
them (llama-cpp-python 0.3.36's vendored llama.cpp, ``tools/server/``): its seats at ``/props`` (``total_slots``),
its batch size stated nowhere and said to be unknown, and its stream's last chunk (no text, a finish reason and the
usage) taken for the end it is, not for a token; vLLM's stream and limits read as before."""

from __future__ import annotations

import asyncio
import json

import httpx

from experiments.real.client import Stream, complete
from experiments.real.limits import ServerLimits, from_props, read_limits

PROPS = {  # the parts of GET /props that matter here (get_res_props)
    "default_generation_settings": {"n_ctx": 4096, "params": {"n_predict": -1}},
    "total_slots": 16,
    "model_alias": "m",
    "build_info": "b1-unknown",
}


def _limits(routes: dict[str, httpx.Response], card: dict) -> ServerLimits:
    def answer(request: httpx.Request) -> httpx.Response:
        return routes.get(request.url.path, httpx.Response(404, text="not found"))

    async def go() -> ServerLimits:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
            return await read_limits(client, "http://srv:8080/v1", card)

    return asyncio.run(go())


def test_llama_servers_slots_are_read_at_props_and_its_batch_size_is_said_to_be_unknown() -> None:
    assert from_props(PROPS) == {"max_num_seqs": 16}
    assert from_props({"model_alias": "m"}) == {} and from_props([16]) == {}
    card = {"id": "m", "object": "model", "owned_by": "llamacpp", "meta": {"n_ctx": 4096}}
    metrics = httpx.Response(501, json={"error": {"message": "This server does not support metrics endpoint."}})
    got = _limits({"/props": httpx.Response(200, json=PROPS), "/metrics": metrics}, card)
    assert (got.max_num_seqs, got.max_num_batched_tokens, got.block_size) == (16, None, None)
    assert got.sources == {"max_num_seqs": "http://srv:8080/props"}
    note = got.unknown_note()
    assert note is not None and "max_num_batched_tokens" in note and "--batch-size" in note
    assert "VLLM_SERVER_DEV_MODE" not in note
    # nonsense is no limit, and a server that states its seats elsewhere is not asked again
    assert _limits({"/props": httpx.Response(200, json={"total_slots": 0})}, card).max_num_seqs is None
    assert _limits({"/props": httpx.Response(200, json=PROPS)}, {"max_num_seqs": 4}).max_num_seqs == 4


def _sse(chunks: list[dict]) -> bytes:
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


def _token(text: str, finish: str | None = None) -> dict:
    return {"object": "text_completion", "choices": [{"text": text, "index": 0, "logprobs": None,
                                                      "finish_reason": finish}]}  # fmt: skip


def _usage(made: int) -> dict:
    return {"prompt_tokens": 5, "completion_tokens": made, "total_tokens": 5 + made}


def _stream(body: bytes) -> Stream:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    async def go() -> Stream:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
            return await complete(client, "http://srv:8080/v1", "m", [1, 2, 3, 4, 5], 4, 0.0, timeout_s=5)

    return asyncio.run(go())


def test_llama_servers_closing_chunk_is_no_token_and_vllms_stream_reads_as_before() -> None:
    # llama-server: a chunk per token, then one without text that carries the finish reason and the usage
    closing = _token("", "length") | {"usage": _usage(4)}
    got = _stream(_sse([_token(" w7"), _token(" w9"), _token(" w11"), _token(" w3"), closing]))
    assert got.ok and len(got.chunk_s) == 4 and not got.coalesced and got.completion_tokens == 4
    # vLLM: the last token's chunk has its finish reason; the usage comes alone, without choices
    got = _stream(_sse([_token(" w7"), _token(" w9"), _token(" w11"), _token(" w3", "length"),
                        {"choices": [], "usage": _usage(4)}]))  # fmt: skip
    assert got.ok and len(got.chunk_s) == 4 and not got.coalesced
    # a last chunk with text is a token; one without is a token too unless its usage counts exactly the tokens
    # before it (an empty piece, as a control token's, still takes a step)
    got = _stream(_sse([_token(" w7"), _token(" w9"), _token(" w11"), _token(" w3", "length") | {"usage": _usage(4)}]))
    assert got.ok and len(got.chunk_s) == 4 and not got.coalesced
    got = _stream(_sse([_token(" w7"), _token(" w9"), _token(" w11"), _token("", "length") | {"usage": _usage(4)}]))
    assert got.ok and len(got.chunk_s) == 4 and not got.coalesced  # the fourth token's text was empty
    got = _stream(_sse([_token(" w7"), _token(" w9"), _token(" w11"), _token("", "length") | {"usage": _usage(3)}]))
    assert got.ok and len(got.chunk_s) == 3 and not got.coalesced
