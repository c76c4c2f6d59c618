"""Whether a GPU's LoRA pre-dropout can be rebuilt bit for bit in backward from its input and the mask's bits
(trainer.lora.dropout_recompute, trainer/model/lora/drop.py), by input dtype. Standard library only: the planner and
`validate` decide the same question as the trainer.

torch's native_dropout on a GPU writes round_dtype(float32(x * s_fwd)) for a kept x, with s_fwd = float32(1 /
float32(1 - p)); the rebuild is its backward op on x, round_dtype(float32(x * s_bwd)) with s_bwd = float32(1 / (1 - p)).
Where the two scales agree (p = 0.1, 0.05, 0.2) every dtype rebuilds. Where they differ by an ulp (p = 0.15) a float32 x
does not (16.4M of 16.8M elements differ on an H100 at p = 0.021), but a bfloat16 x often still does: its 8-bit
significand leaves the product's rounding to 8 bits untouched by the scale's last bit, except for some significands.
That is decided here over every finite bfloat16 value (32,640 magnitudes; the sign is symmetric), not sampled.
Other 16-bit dtypes take the float32 rule (enough for any dtype, as the scales are then equal)."""
from __future__ import annotations

import functools
import math
import struct
from array import array

# float32's largest finite value, and the magnitude at which a float32 rounds to infinity (half an ulp above the largest;
# ties go to even, and the largest float32's significand is odd)
_F32_MAX = struct.unpack("<f", bytes.fromhex("ffff7f7f"))[0]
_F32_INF_AT = 2.0 ** 128 - 2.0 ** 103


def _float32(x: float) -> float:
    """x rounded once to float32 (round half to even): a double product of two float32 values is exact, so this is
    the GPU's float32 multiply."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def _past_max(v: float) -> float:
    """v with a magnitude past float32's largest made the value its float32 rounding gives (the largest or infinity),
    so the bulk conversion below never sees an out-of-range double."""
    a = abs(v)
    return v if a <= _F32_MAX else math.copysign(_F32_MAX if a < _F32_INF_AT else math.inf, v)


def _bfloat16_bits(values: list[float]) -> list[int]:
    """Each double rounded to float32, then to bfloat16 (round half to even both times), as 16 bits."""
    bits = array("I", array("f", [_past_max(v) for v in values]).tobytes())
    return [(b + 0x7FFF + ((b >> 16) & 1)) >> 16 for b in bits]  # inf stays inf; no NaN reaches here


@functools.lru_cache(maxsize=1)
def _every_bfloat16() -> tuple[float, ...]:
    """Every finite non-negative bfloat16 (the sign is symmetric; 0x7F80 is +inf), as floats."""
    return tuple(array("f", array("I", [h << 16 for h in range(0x7F80)]).tobytes()))


def scales(p: float) -> tuple[float, float]:
    """(native_dropout's forward scale, its backward op's scale) at probability p, both float32."""
    return _float32(1.0 / _float32(1.0 - p)), _float32(1.0 / (1.0 - p))


@functools.lru_cache(maxsize=64)
def _bfloat16_rebuilds(fwd: float, bwd: float) -> bool:
    xs = _every_bfloat16()
    return _bfloat16_bits([x * fwd for x in xs]) == _bfloat16_bits([x * bwd for x in xs])


def dropout_recomputable(p: float, dtype: str = "float32") -> bool:
    """Whether native_dropout's output at p on an input of `dtype` ("float32", "bfloat16", "float16") equals its
    backward op applied to the input for every kept element: then the adapters keep the input and the mask's bits, else
    the dropped copy and a byte mask (the CPU's noise is always rebuilt)."""
    fwd, bwd = scales(p)
    if fwd == bwd:
        return True
    return dtype == "bfloat16" and _bfloat16_rebuilds(fwd, bwd)


def activation_dtype(precision: dict) -> str:
    """The dtype an adapter's input has under a recipe's `trainer.precision` (FP8/FP4 keep 16-bit activations)."""
    return "bfloat16" if precision["bf16"] else "float32"
