"""Number formats: what a weight, an activation and a KV-cache entry cost in bytes, and which peak rate a GEMM runs at.

Compression shows up in serving through these three choices, which ferry keeps apart as vLLM's flags do:
- ``dtype`` (vLLM ``--dtype``): activations, embeddings, norms and the LM head; ``auto`` takes the config's
  ``torch_dtype``, except that float32 checkpoints run in float16 (vLLM's rule for ``auto``);
- ``quantization`` (vLLM ``--quantization``): the linear-layer weights of the transformer blocks, fewer bytes per decode
  step (fp8 with one scale per tensor, ``fp8_block`` with one per 128 x 128 block as DeepSeek's and Qwen3's FP8
  checkpoints, ``nvfp4`` (4-bit floats with an FP8 scale per 16, Blackwell's tensor cores), ``mxfp4`` (4-bit floats
  with an 8-bit power-of-two scale per 32, GPT-OSS's experts; weight-only: multiplied in the activation format, as
  vLLM's Marlin/Triton MXFP4 MoE on Hopper), int8 or int4;
  ``awq``/``gptq`` are int4 weight-only);
- ``kv_cache_dtype`` (vLLM ``--kv-cache-dtype``): the KV cache, more tokens per GiB (``auto`` = ``dtype``; ``fp8``).
"""

from __future__ import annotations

from dataclasses import dataclass

# bytes per element of each canonical format (int4 packs two weights per byte; group scales are not counted, they add
# about 16 bits per 128 weights, ~3%; fp8_block's one fp32 scale per 128 x 128 weights is not counted either; nvfp4 is
# 4 bits and one 8-bit scale per 16 weights, 4.5 bits; mxfp4 is 4 bits and one 8-bit scale per 32, 4.25 bits, the
# OCP Microscaling format's MXFP4)
DTYPE_BYTES: dict[str, float] = {
    "float32": 4.0,
    "bfloat16": 2.0,
    "float16": 2.0,
    "fp8": 1.0,
    "fp8_block": 1.0,
    "int8": 1.0,
    "nvfp4": 0.5625,
    "mxfp4": 0.53125,
    "int4": 0.5,
}

# the names users write (vLLM's and PyTorch's spellings) -> canonical
_ALIASES: dict[str, str] = {
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "fp8": "fp8",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
    "float8": "fp8",
    "fp8_block": "fp8_block",
    "fp8-block": "fp8_block",
    "nvfp4": "nvfp4",
    "fp4": "nvfp4",
    "mxfp4": "mxfp4",
    "int8": "int8",
    "w8a8": "int8",
    "int4": "int4",
    "awq": "int4",
    "gptq": "int4",
}

# activations must be a floating format the GEMMs read and write
ACTIVATION_DTYPES = ("float32", "bfloat16", "float16")
KV_CACHE_DTYPES = ("float32", "bfloat16", "float16", "fp8")
QUANTIZATIONS = ("fp8", "fp8_block", "nvfp4", "mxfp4", "int8", "int4")
# what the commands' --quantization help says of them
QUANTIZATION_HELP = (
    "weights: fp8 (quantized at load), int8, int4 (awq/gptq); a quantized checkpoint's own format (fp8_block, "
    "nvfp4, mxfp4) comes from its config.json"
)

# key of a format in a hardware profile's ``peak_tflops`` table
PEAK_KEY: dict[str, str] = {
    "float32": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "fp8": "fp8",
    "fp8_block": "fp8",
    "int8": "int8",
    "nvfp4": "fp4",
}


def canonical(name: str) -> str:
    """The canonical name of a format (``bf16`` -> ``bfloat16``); ValueError for an unknown one."""
    key = name.strip().lower().removeprefix("torch.")
    if key not in _ALIASES:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(sorted(_ALIASES))}")
    return _ALIASES[key]


def auto_dtype(torch_dtype: str | None) -> str:
    """vLLM's ``--dtype auto``: the checkpoint's dtype, but float16 for float32 (or unstated) checkpoints."""
    if torch_dtype is None:
        return "float16"
    dt = canonical(torch_dtype)
    return "float16" if dt == "float32" else dt


@dataclass(frozen=True, slots=True)
class Dtypes:
    """The resolved formats of one deployment."""

    # activations, embeddings, norms and the LM head (the model's compute dtype)
    activation: str
    # linear-layer weights of the transformer blocks (== activation unless quantized)
    weight: str
    # KV-cache entries
    kv_cache: str
    # the quantization method as asked (None, "fp8", "int8", "int4"); decides the GEMM's compute format with the device
    quantization: str | None = None

    @property
    def activation_bytes(self) -> float:
        return DTYPE_BYTES[self.activation]

    @property
    def weight_bytes(self) -> float:
        return DTYPE_BYTES[self.weight]

    @property
    def kv_bytes(self) -> float:
        return DTYPE_BYTES[self.kv_cache]

    @classmethod
    def resolve(
        cls,
        torch_dtype: str | None,
        dtype: str | None = None,
        kv_cache_dtype: str | None = None,
        quantization: str | None = None,
    ) -> Dtypes:
        """Resolve vLLM-style flags against the checkpoint's ``torch_dtype``; ValueError naming a bad value."""
        if dtype is None or dtype.strip().lower() == "auto":
            act = auto_dtype(torch_dtype)
        else:
            act = canonical(dtype)
            if act not in ACTIVATION_DTYPES:
                raise ValueError(
                    f"dtype {dtype!r} is not an activation format (choose auto, float32, bfloat16 or float16); "
                    "for fp8/int8/int4 weights use quantization"
                )
        if kv_cache_dtype is None or kv_cache_dtype.strip().lower() == "auto":
            kv = act
        else:
            kv = canonical(kv_cache_dtype)
            if kv not in KV_CACHE_DTYPES:
                raise ValueError(
                    f"kv_cache_dtype {kv_cache_dtype!r} is not supported; choose auto, fp8 or a float dtype"
                )
        if quantization is None or quantization.strip().lower() in ("", "none"):
            quant, weight = None, act
        else:
            quant = canonical(quantization)
            if quant not in QUANTIZATIONS:
                raise ValueError(
                    f"quantization {quantization!r} is not supported; choose none, {', '.join(QUANTIZATIONS)}"
                )
            weight = quant
        return cls(activation=act, weight=weight, kv_cache=kv, quantization=quant)

    def gemm_compute(self, peaks: dict[str, float]) -> str:
        """The format the linear layers' multiply-adds run in on a device with these ``peaks`` (TFLOP/s by PEAK_KEY).

        fp8 (per tensor or block-scaled), int8 and nvfp4 quantization run in their own format where the device has
        its rate (vLLM's fp8 on Hopper/Ada, int8 on Ampere, NVFP4 on Blackwell), else fall back to weight-only
        (dequantize, multiply in the activation format; vLLM's Marlin path); int4 and mxfp4 are always weight-only.
        """
        if self.quantization in ("fp8", "fp8_block", "int8", "nvfp4") and PEAK_KEY[self.quantization] in peaks:
            return self.quantization
        return self.activation

    def describe(self) -> str:
        return f"activations {self.activation}, weights {self.weight}, KV cache {self.kv_cache}"
