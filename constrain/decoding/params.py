"""Sampling parameters: one immutable, validated :class:`SamplingParams` per row, and named presets."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any

import numpy as np

from constrain.errors import SamplingParamsError, ShapeError

# Relative slack when deciding whether a cumulative mass "reaches" top_p.
TOP_P_RTOL = 1e-6
# Relative slack on p_i >= min_p * max p (applied in log space: log p_i - log max p >= log min_p - MIN_P_RTOL).
MIN_P_RTOL = 1e-5


# ----------------------------------------------------------------------------------------------------------------
# parameters
# ----------------------------------------------------------------------------------------------------------------


def _is_real(x: Any) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


@dataclass(frozen=True)
class SamplingParams:
    """Settings of one decoding step, validated on construction.

    ``temperature`` >= 0 (0 = greedy); ``top_k`` >= 0 (0 = off); 0 < ``top_p`` <= 1 (1 = off);
    0 <= ``min_p`` <= 1 (0 = off); ``repetition_penalty`` > 0 (1 = off); ``frequency_penalty`` and
    ``presence_penalty`` finite (0 = off; negative values encourage repetition); ``no_repeat_ngram_size`` >= 0
    (0 = off); ``logit_bias`` maps token id (>= 0) to a bias added to its logit (finite, or ``-inf`` to ban it);
    ``seed`` None (fresh entropy) or an int >= 0.

    An out-of-range value raises :class:`SamplingParamsError` naming the parameter.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    no_repeat_ngram_size: int = 0
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    seed: int | None = None

    def __post_init__(self) -> None:
        def real(name: str, lo: float | None, hi: float | None, lo_open: bool, requirement: str) -> None:
            v = getattr(self, name)
            if not _is_real(v) or math.isnan(v) or math.isinf(v):
                raise SamplingParamsError(name, v, requirement)
            if lo is not None and (v < lo or (lo_open and v == lo)):
                raise SamplingParamsError(name, v, requirement)
            if hi is not None and v > hi:
                raise SamplingParamsError(name, v, requirement)
            object.__setattr__(self, name, float(v))

        real("temperature", 0.0, None, False, "must be a finite number >= 0 (0 means greedy)")
        real("top_p", 0.0, 1.0, True, "must be a number with 0 < top_p <= 1 (1 disables top-p)")
        real("min_p", 0.0, 1.0, False, "must be a number with 0 <= min_p <= 1 (0 disables min-p)")
        real("repetition_penalty", 0.0, None, True, "must be a finite number > 0 (1 disables it)")
        real("frequency_penalty", None, None, False, "must be a finite number")
        real("presence_penalty", None, None, False, "must be a finite number")
        for name in ("top_k", "no_repeat_ngram_size"):
            v = getattr(self, name)
            if not _is_int(v) or not 0 <= v < 2**63:
                raise SamplingParamsError(name, v, "must be an int with 0 <= value < 2**63 (0 disables it)")
            object.__setattr__(self, name, int(v))
        if self.seed is not None:
            if not _is_int(self.seed) or self.seed < 0:
                raise SamplingParamsError("seed", self.seed, "must be None or an int >= 0")
            object.__setattr__(self, "seed", int(self.seed))
        bias = self.logit_bias
        if bias is None:
            bias = {}
        if not isinstance(bias, Mapping):
            raise SamplingParamsError("logit_bias", bias, "must be a mapping token id -> float")
        clean: dict[int, float] = {}
        for k, v in bias.items():
            if not _is_int(k) or k < 0:
                raise SamplingParamsError("logit_bias", bias, f"keys must be token ids (ints >= 0), got {k!r}")
            if not _is_real(v) or math.isnan(v) or v == math.inf:
                raise SamplingParamsError(
                    "logit_bias", bias, f"values must be finite floats or -inf, got {v!r} for token {k}"
                )
            clean[int(k)] = float(v)
        object.__setattr__(self, "logit_bias", MappingProxyType(clean))

    @property
    def greedy(self) -> bool:
        """True when this step takes the arg-max (temperature 0)."""
        return self.temperature == 0.0

    def replace(self, **changes: Any) -> SamplingParams:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> SamplingParams:
        """One of :data:`PRESETS` (``extraction``, ``code``, ``chat``, ``creative``), with optional overrides."""
        try:
            base = PRESETS[name]
        except KeyError:
            raise SamplingParamsError("preset", name, f"must be one of {sorted(PRESETS)}") from None
        return base.replace(**overrides) if overrides else base

    def __hash__(self) -> int:
        values = tuple(getattr(self, f.name) for f in fields(self) if f.name != "logit_bias")
        return hash((values, frozenset(self.logit_bias.items())))

    def __reduce__(self):  # MappingProxyType does not pickle
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values["logit_bias"] = dict(values["logit_bias"])
        return (_rebuild_params, (values,))


def _rebuild_params(values: dict) -> SamplingParams:
    return SamplingParams(**values)


#: Presets for common tasks. Start from one and override what you need: ``SamplingParams.preset("chat", seed=0)``.
#:
#: - ``extraction``: greedy (temperature 0). Filling a schema or pulling fields out of a document wants the most
#:   likely value, reproducibly; the structure already guarantees the shape.
#: - ``code``: temperature 0.2, top-p 0.95. Close to greedy, with a little room among near-equivalent spellings.
#: - ``chat``: temperature 0.7, top-p 0.9, repetition penalty 1.05. Natural variety without drifting.
#: - ``creative``: temperature 1.0, min-p 0.05, frequency and presence penalties 0.2. Min-p cuts the implausible
#:   tail relative to the model's confidence, so a full temperature stays coherent; the penalties discourage loops.
PRESETS: Mapping[str, SamplingParams] = MappingProxyType(
    {
        "extraction": SamplingParams(temperature=0.0),
        "code": SamplingParams(temperature=0.2, top_p=0.95),
        "chat": SamplingParams(temperature=0.7, top_p=0.9, repetition_penalty=1.05),
        "creative": SamplingParams(temperature=1.0, min_p=0.05, frequency_penalty=0.2, presence_penalty=0.2),
    }
)


class _Rows:
    """Per-row parameter arrays for a batch."""

    __slots__ = (
        "n",
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "rep",
        "freq",
        "pres",
        "ngram",
        "bias",
        "any_penalty",
    )

    def __init__(self, params: SamplingParams | Sequence[SamplingParams] | None, n: int):
        if params is None:
            params = SamplingParams()
        if isinstance(params, SamplingParams):
            plist = [params]
        else:
            plist = list(params)
            for i, p in enumerate(plist):
                if not isinstance(p, SamplingParams):
                    raise SamplingParamsError(f"params[{i}]", p, "each must be a SamplingParams")
            if len(plist) != n:
                raise ShapeError(f"got {len(plist)} SamplingParams for a batch of {n} rows; expected one per row")
        self.n = n

        def col(name: str, dtype: Any) -> np.ndarray:
            a = np.array([getattr(p, name) for p in plist], dtype=dtype)
            return np.broadcast_to(a, (n,)) if len(plist) == 1 else a

        self.temperature = col("temperature", np.float64)
        self.top_k = col("top_k", np.int64)
        self.top_p = col("top_p", np.float64)
        self.min_p = col("min_p", np.float64)
        self.rep = col("repetition_penalty", np.float64)
        self.freq = col("frequency_penalty", np.float64)
        self.pres = col("presence_penalty", np.float64)
        self.ngram = col("no_repeat_ngram_size", np.int64)
        self.bias = [p.logit_bias for p in plist] if len(plist) > 1 else [plist[0].logit_bias] * n
        self.any_penalty = bool(
            np.any(self.rep != 1.0) or np.any(self.freq != 0.0) or np.any(self.pres != 0.0) or np.any(self.ngram > 0)
        )
