"""What draws a workload's requests, as a scenario gives it: a length distribution (`LengthDist`: fixed,
uniform, lognormal by mean and p99 or sigma, or resampled from a length table) and the arrival process
(`Arrival`: Poisson, gamma by CV, constant, or a trace's own times). Validated here; drawn by
`kvsim.workload.generate`. Part of the scenario (`kvsim.workload.traffic.Workload`).
"""

from __future__ import annotations

import math
import sys
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from kvsim.model.spec import Settings
from kvsim.workload.traces import MAX_LENGTH


class Fixed(Settings):
    dist: Literal["fixed"]
    value: int = Field(gt=0, le=MAX_LENGTH)


class Uniform(Settings):
    dist: Literal["uniform"]
    low: int = Field(gt=0, le=MAX_LENGTH)
    high: int = Field(gt=0, le=MAX_LENGTH)

    @model_validator(mode="after")
    def _ordered(self) -> Uniform:
        if self.high < self.low:
            raise ValueError(f"high={self.high} is below low={self.low}")
        return self


class Lognormal(Settings):
    """By mean and p99 (solved for sigma), or by mean and sigma."""

    dist: Literal["lognormal"]
    mean: float = Field(gt=0)
    p99: float | None = Field(default=None, gt=0)
    sigma: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _one_shape(self) -> Lognormal:
        if (self.p99 is None) == (self.sigma is None):
            raise ValueError("give exactly one of p99 or sigma")
        if self.sigma is not None and self.sigma > math.sqrt(sys.float_info.max):  # mu = log(mean) - sigma² / 2
            raise ValueError(f"sigma={self.sigma:g}: too wide to draw from (sigma² overflows a float; a sigma of "
                             "10 already puts the p99 e^23 times above the median)")
        if self.p99 is not None and self.p99 <= self.mean:
            raise ValueError(f"p99={self.p99} must exceed mean={self.mean}")
        return self


class Empirical(Settings):
    """Resample one column of a length table (`builtin:sharegpt_lengths` or a CSV path)."""

    dist: Literal["empirical"]
    table: str
    column: Literal["prompt", "output"]


LengthDist = Annotated[Fixed | Uniform | Lognormal | Empirical, Field(discriminator="dist")]


class Arrival(Settings):
    """Inter-arrival process; `trace` uses the trace's own timestamps (scaled by `rate_scale`)."""

    process: Literal["poisson", "gamma", "constant", "trace"] = "poisson"
    rate: float | None = Field(default=None, gt=0, description="requests per second")
    cv: float = Field(default=1.0, gt=0, description="coefficient of variation of gaps (gamma)")

    @model_validator(mode="after")
    def _rate_given(self) -> Arrival:
        if self.process != "trace" and self.rate is None:
            raise ValueError(f"process={self.process} needs a rate")
        if self.process == "trace" and self.rate is not None:  # it would be ignored: the trace's times are used
            raise ValueError(f"rate={self.rate:g}: process=trace replays the trace's own arrival times, so no rate "
                             "applies; scale them with workload.trace.rate_scale (to switch a scenario that sets a "
                             "rate to its trace: --set 'workload.arrival={process: trace}'), or give process=poisson "
                             "for Poisson arrivals at a rate")
        return self

    @model_validator(mode="after")
    def _cv_read_by_gamma(self) -> Arrival:
        """Only gamma gaps have a coefficient of variation to set (Poisson's is 1, constant's 0): `cv: 3` beside
        `process: poisson` drew Poisson arrivals without a word. The default (written in every scenario) passes."""
        self.refuse_unread("process", {"cv": ("gamma",)}, "{:g}".format, only="gamma, whose gaps it shapes")
        return self

    @field_validator("cv")
    @classmethod
    def _gamma_shape_finite(cls, cv: float) -> float:
        """Gamma gaps have shape 1/cv²: past about 1.3e154 cv² overflowed (an OverflowError), under about 1e-154
        the shape did (a ZeroDivisionError, or NaN arrivals and a RuntimeError), each a traceback mid-run."""
        try:
            shape = 1.0 / cv**2
        except (OverflowError, ZeroDivisionError):
            shape = math.inf
        if not math.isfinite(shape) or shape == 0:
            raise ValueError("the gamma gaps' shape 1/cv² is not a finite number")
        return cv
