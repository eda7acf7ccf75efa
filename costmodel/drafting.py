"""What speculative decoding's drafter costs each step, compiled: the work vLLM 0.32.0's proposer does after the
target's forward pass (``vllm/v1/spec_decode/eagle.py`` ``EagleProposer.propose``; ``draft_model.py``;
``ngram_proposer.py``), timed by the roofline like the target's kernels (``costmodel.formulas``).

An EAGLE-like drafter or a draft model runs its layers once over every token of the step (the target's tokens: it keeps
its own KV cache of them, prompts included) and samples a draft for each of the step's sequences, then ``k - 1`` more
times over one token per sequence (each a decode one token further on). What one pass runs:
- ``eagle``, ``eagle3``: one decoder layer of the target's attention and hidden size (a dense MLP of the target's
  ``intermediate_size``, an assumption for a MoE target), an input projection of the concatenated embedding and hidden
  state(s) to the hidden size on the first pass (``fc``: 2 x H -> H for EAGLE; 3 x H -> H for EAGLE-3, which fuses
  three of the target's layers), and an LM head: the target's vocabulary for EAGLE, a draft vocabulary of 32,000
  tokens for EAGLE-3 (``draft_vocab_size`` of yuhuili/EAGLE3-LLaMA3.1-Instruct-8B's config.json; an assumption for
  other heads);
- ``mtp``: the target's MTP module (DeepSeek-V3, ``vllm/model_executor/models/deepseek_mtp.py``): one decoder layer of
  the target's kind (MLA, MoE), ``eh_proj`` (2 x H -> H) on the first pass, the shared LM head;
- ``draft_model``: the draft's own layers and LM head, at ``draft_tensor_parallel_size``;
- ``ngram``: no GPU work: host time per sequence (``NGRAM_HOST_S``, an assumption: vLLM's numba prompt lookup over a
  request's tokens, not measured here).
The draft passes are launched within the step: their host overheads are not counted (an assumption: vLLM captures the
drafter in CUDA graphs). With a draft count by batch size, the step drafts the count of its number of sequences (0:
no drafting).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
from numba import njit

from costmodel import formulas as f
from costmodel import numba_cache
from costmodel.model_spec import ModelSpec

if TYPE_CHECKING:
    from costmodel.roofline import CostModel

numba_cache.configure()  # before anything here is compiled (see costmodel.numba_cache)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

NGRAM_HOST_S = 10e-6  # host seconds the n-gram proposer takes per sequence and step (an assumption, not measured)
EAGLE3_DRAFT_VOCAB = 32_000  # yuhuili/EAGLE3-LLaMA3.1-Instruct-8B's draft_vocab_size
# the drafter's ``spec`` array: its kind (0 none, 1 layers, 2 host only), its draft count, the fc's inputs (in hidden
# sizes; 0: none), host seconds per sequence, then the draft count by batch size (empty: always K)
KIND, K, FC_IN, HOST_S = range(4)
SPEC_HEAD = 4
NONE, LAYERS, HOST = 0, 1, 2
O_PROJ = f.KERNEL_ROW["o_proj"]  # a GEMM of the drafter's weights' format: the fc is timed at its rates


@dataclass(frozen=True, eq=False)
class Drafter:
    """The drafter of a speculative-decoding replica, as the cost model times it."""

    method: str  # eagle, eagle3, mtp, ngram or draft_model
    num_speculative_tokens: int  # k
    layers: ModelSpec | None = None  # what one draft pass runs (None: ngram)
    tp: int = 1  # GPUs the draft layers are split over
    fc_inputs: int = 0  # the first pass's input projection: fc_inputs x H -> H (0: none)
    own_lm_head: bool = False  # it holds an LM head of its own (else the target's, shared)
    own_embedding: bool = False  # it holds an embedding of its own
    per_batch: IntArray | None = None  # the draft count by batch size (``sim.speculation.Speculation``)

    def spec(self) -> FloatArray:
        """The compiled view (``KIND`` ...)."""
        lookup = self.per_batch if self.per_batch is not None else np.zeros(0, dtype=np.int64)
        head = [LAYERS if self.layers is not None else HOST, self.num_speculative_tokens, self.fc_inputs,
                NGRAM_HOST_S if self.layers is None else 0.0]  # fmt: skip
        return np.concatenate([np.array(head, dtype=np.float64), lookup.astype(np.float64)])

    def describe(self) -> str:
        if self.layers is None:
            return f"{self.method}: prompt lookup on the host, {NGRAM_HOST_S * 1e6:g} us a sequence (assumed)"
        what = self.layers.name if self.method == "draft_model" else f"{self.layers.num_hidden_layers} layer"
        return f"{self.method}: {what}, k={self.num_speculative_tokens}" + (f", tp {self.tp}" if self.tp > 1 else "")


def drafter_for(method: str, k: int, target: ModelSpec, draft: ModelSpec | None = None, tp: int = 1,
                per_batch: IntArray | None = None) -> Drafter:  # fmt: skip
    """The drafter of ``method`` for ``target`` (``draft``: a draft model's spec)."""
    if method == "ngram":
        return Drafter(method, k, per_batch=per_batch)
    if method == "draft_model":
        assert draft is not None
        return Drafter(method, k, draft, tp, own_lm_head=True, own_embedding=True, per_batch=per_batch)
    if method == "mtp":  # the target's layer kind (an MoE layer where the target's last layers are)
        layer = dataclasses.replace(target, name=f"{target.name} MTP", num_hidden_layers=1, window_layers=None,
                                    sliding_window=None, moe_layers=(0,) if target.is_moe else None)  # fmt: skip
        return Drafter(method, k, layer, tp, fc_inputs=2, own_lm_head=True, own_embedding=True, per_batch=per_batch)
    head = dataclasses.replace(
        target, name=f"{target.name} {method} head", num_hidden_layers=1, window_layers=None, sliding_window=None,
        num_local_experts=1, num_experts_per_tok=1, moe_layers=None, shared_expert_intermediate_size=0,
        moe_intermediate_size=0, vocab_size=EAGLE3_DRAFT_VOCAB if method == "eagle3" else target.vocab_size,
    )  # fmt: skip
    return Drafter(method, k, head, tp, fc_inputs=3 if method == "eagle3" else 2, own_lm_head=method == "eagle3",
                   per_batch=per_batch)  # fmt: skip


def attach(cost: CostModel, drafter: Drafter) -> tuple[CostModel | None, Any]:
    """The cost model of ``drafter``'s layers on ``cost``'s device (at the drafter's tensor parallelism, by the
    roofline curves: no measured table, no host overheads) and the ``dargs`` of ``drafting_time``. An EAGLE head is
    unquantized; an MTP module is stored as the target is; a draft model as its own config says."""
    from costmodel.roofline import CostModel

    spec = drafter.spec()
    if drafter.layers is None:  # host time only
        return None, (np.zeros(1), np.zeros((1, f.NUM_PARAMS)), cost.tables.toc, cost.tables.tab, f.NO_MEMO, spec)
    dtypes = cost.dtypes
    quant = dtypes.quantization if drafter.method == "mtp" else None
    kv_dtype = None if dtypes.kv_cache == dtypes.activation else dtypes.kv_cache
    layers = CostModel(drafter.layers, cost.hardware, tp=drafter.tp, dtype=dtypes.activation, kv_cache_dtype=kv_dtype,
                       quantization=quant, tables=False)  # fmt: skip
    consts = layers._consts.copy()
    consts[f.PER_ITERATION] = consts[f.PER_SEQUENCE] = consts[f.PER_PREFILL] = 0.0  # launched within the step
    return layers, (consts, layers._kernel_params, layers.tables.toc, layers.tables.tab, f.new_memo(), spec)


def drafter_bytes(cost: CostModel) -> tuple[float, int]:
    """(weight bytes, KV-cache bytes per token) ``cost``'s drafter adds on one GPU (of the last pipeline stage): its
    layers, its input projection, and the LM head and embedding it holds of its own (a draft model: all of it)."""
    d, layers = cost.drafter, cost.draft_cost
    if d is None or layers is None or d.layers is None:
        return 0.0, 0
    h, a = float(d.layers.hidden_size), cost.dtypes.activation_bytes
    if d.method == "draft_model":
        weights = layers.layout.stage_weight_bytes(0)
    else:
        weights = layers.layout.layer_weight_bytes(0) + d.fc_inputs * h * h * a
        weights += (int(d.own_lm_head) + int(d.own_embedding)) * layers.layout.vocab * h * a
    return weights, layers.layout.stage_kv_bytes_per_token(0)


@njit(cache=True)
def drafts_of(spec: FloatArray, sequences: int) -> int:
    """Drafts each sequence of a step of ``sequences`` gets."""
    n = spec.shape[0] - SPEC_HEAD
    if n == 0:
        return int(spec[K])
    return int(spec[SPEC_HEAD + min(sequences, n - 1)])


@njit(cache=True)
def drafting_time(
    dargs: tuple[FloatArray, FloatArray, IntArray, FloatArray, FloatArray, FloatArray], prefill_new: IntArray,
    prefill_ctx: IntArray, decode_ctx: IntArray, verify_new: IntArray, verify_ctx: IntArray,
) -> float:  # fmt: skip
    """Seconds the drafter takes after a step of this shape; ``dargs`` is its layers' cost model's ``(consts,
    kernel_params, toc, tab, memo)`` (``costmodel.formulas``, no measured tables) and ``Drafter.spec``."""
    dconsts, dparams, dtoc, dtab, dmemo, spec = dargs
    if spec[KIND] == NONE:
        return 0.0
    sequences = prefill_new.shape[0] + decode_ctx.shape[0] + verify_new.shape[0]
    k = drafts_of(spec, sequences)
    if k == 0 or sequences == 0:
        return 0.0
    if spec[KIND] == HOST:
        return spec[HOST_S] * sequences
    # the first pass: every token of the step, one draft sampled per sequence
    s = f.shape_sums(dconsts, prefill_new, prefill_ctx, decode_ctx, 0, verify_new, verify_ctx)
    sums = (s[0], s[1], s[2], float(sequences), s[4], s[5], s[6], s[7], s[8], s[9], s[10], s[11], s[12], s[13], s[14],
            s[15], s[16])  # fmt: skip
    t = f.time_of_sums(dconsts, dparams, dtoc, dtab, sums, dmemo)
    if spec[FC_IN] > 0.0:
        h, tokens = dconsts[f.H], sums[0]
        flops = 2.0 * tokens * spec[FC_IN] * h * h
        nbytes = spec[FC_IN] * h * h * dconsts[f.W] + tokens * (spec[FC_IN] + 1.0) * h * dconsts[f.A]
        tc, tm = f.kernel_time(flops, nbytes, dparams[O_PROJ])
        t += tc if tc >= tm else tm
    # k - 1 more: one token a sequence, each a token further on
    ctx = np.empty(sequences, dtype=np.int64)
    n = 0
    for j in range(prefill_new.shape[0]):
        ctx[n] = prefill_ctx[j] + prefill_new[j]
        n += 1
    for j in range(decode_ctx.shape[0]):
        ctx[n] = decode_ctx[j] + 1
        n += 1
    for j in range(verify_new.shape[0]):
        ctx[n] = verify_ctx[j] + verify_new[j]
        n += 1
    for _ in range(k - 1):
        t += f.time_of_sums(dconsts, dparams, dtoc, dtab, f.shape_sums(dconsts, f.NO_VERIFY, f.NO_VERIFY, ctx, 0),
                            dmemo)  # fmt: skip
        ctx += 1
    return t


@njit(cache=True)
def iteration_time(
    args: tuple[tuple[FloatArray, FloatArray, IntArray, FloatArray, FloatArray],
                tuple[FloatArray, FloatArray, IntArray, FloatArray, FloatArray, FloatArray]],
    prefill_new: IntArray, prefill_ctx: IntArray, decode_ctx: IntArray, prefill_sampled: int,
    verify_new: IntArray = f.NO_VERIFY, verify_ctx: IntArray = f.NO_VERIFY,
) -> float:  # fmt: skip
    """``formulas.iteration_time`` with the drafter's work after the target's: ``args`` is the target's ``args`` and
    the drafter's (``drafting_time``)."""
    target, drafter = args
    return f.iteration_time(target, prefill_new, prefill_ctx, decode_ctx, prefill_sampled, verify_new,
                            verify_ctx) + drafting_time(drafter, prefill_new, prefill_ctx, decode_ctx, verify_new,
                                                        verify_ctx)  # fmt: skip
