"""Multi-turn conversations: each session's turn k + 1 is sent a think time after turn k's answer has arrived, and its
prompt is the conversation so far (every earlier message and answer) followed by a new message. What a later turn
shares with the one before it is exactly that turn's prompt and answer, so a prefix cache can spare all but the new
message (``sim.prefix_cache``), if the blocks are still cached when the next turn comes.

The rows: every session's first turn in arrival order, then every session's second turn, and so on (a turn's row is
after its predecessor's, ``Workload.after``); ids ``S-K`` (session S, turn K, from 0 and 1).
"""

from __future__ import annotations

import numpy as np

from sim.workload.base import Workload
from sim.workload.lengths import LengthSpec, parse_length_spec
from sim.workload.prefixes import Prefixes

_MASK = (1 << 62) - 1
MESSAGE, ANSWER = 1, 2  # kinds of a conversation's segments


def multi_turn(
    first: Workload,
    turns: int,
    think_time_s: float,
    input_len: LengthSpec | str | int,
    output_len: LengthSpec | str | int,
    rng: np.random.Generator,
) -> Workload:
    """Sessions of ``turns`` turns, one starting at each request of ``first`` (its arrival, prompt and output are the
    first turn's; its prefixes, a shared system prompt say, lead every turn's prompt). Later turns draw a new
    message from ``input_len`` and an answer from ``output_len``; think times are exponential with mean
    ``think_time_s`` (0: the next message is sent as the answer ends). Draws, in order: the messages, the answers, the
    think times."""
    if turns < 1:
        raise ValueError(f"turns={turns} must be >= 1")
    if not think_time_s >= 0:
        raise ValueError(f"think_time_s={think_time_s} must be >= 0")
    n = len(first)
    later = (turns - 1) * n
    messages = parse_length_spec(input_len).sample(later, rng).reshape(turns - 1, n) if later else np.zeros((0, n))
    answers = parse_length_spec(output_len).sample(later, rng).reshape(turns - 1, n) if later else np.zeros((0, n))
    think = rng.exponential(think_time_s, size=later) if think_time_s > 0 else np.zeros(later)

    prompt = np.zeros((turns, n), dtype=np.int64)
    output = np.zeros((turns, n), dtype=np.int64)
    prompt[0], output[0] = first.prompt_tokens, first.output_tokens
    for k in range(1, turns):
        prompt[k] = prompt[k - 1] + output[k - 1] + messages[k - 1]
        output[k] = answers[k - 1]
    arrival = np.full((turns, n), np.nan)
    arrival[0] = first.arrival_s
    after = np.full((turns, n), -1, dtype=np.int64)
    after[1:] = np.arange(later).reshape(turns - 1, n)  # row of the same session's turn before
    think_s = np.concatenate([np.zeros(n), think])
    ids = np.array([f"{s}-{k + 1}" for k in range(turns) for s in range(n)], dtype=object)
    source = f"{first.source} turns={turns} think={think_time_s:g}s"
    return Workload(
        arrival.ravel(), prompt.ravel(), output.ravel(), ids, source, _segments(first, prompt, output), after.ravel(),
        think_s,
    )  # fmt: skip


def _segments(first: Workload, prompt: np.ndarray, output: np.ndarray) -> Prefixes:
    """Each turn's content as segments: the first turn's shared prefix (if any), then its own message, each answer
    and each later message in order; a turn's own answer closes its list (what the next turn starts with)."""
    turns, n = prompt.shape
    ids: list[int] = []
    tokens: list[int] = []
    offsets = [0]
    base = first.prefixes
    covered = base.covered() if base is not None else np.zeros(n, dtype=np.int64)
    for k in range(turns):
        for s in range(n):
            lead_ids: list[int] = [] if base is None else base.ids[base.offsets[s] : base.offsets[s + 1]].tolist()
            lead_tokens: list[int] = [] if base is None else base.tokens[base.offsets[s] : base.offsets[s + 1]].tolist()
            ids += lead_ids
            tokens += lead_tokens
            own = int(prompt[0, s] - covered[s])  # the first message, after the shared prefix
            for j in range(k + 1):
                if own > 0:
                    ids.append(_id(MESSAGE, s, j))
                    tokens.append(own)
                ids.append(_id(ANSWER, s, j))
                tokens.append(int(output[j, s]))
                own = int(prompt[j + 1, s] - prompt[j, s] - output[j, s]) if j + 1 < turns else 0
            offsets.append(len(ids))
    return Prefixes(np.asarray(ids, dtype=np.int64), np.asarray(tokens, dtype=np.int64), np.asarray(offsets))


def _id(kind: int, session: int, turn: int) -> int:
    """A segment id of its own (integers hash the same in every process, unlike strings)."""
    return hash((kind, session, turn)) & _MASK
