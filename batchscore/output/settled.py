"""What an output folder settled on: the precision (and budget) its first run measured and chose,
and the ranges int8 / uint8 embeddings are quantized with.

A run that leaves something to measurement (`batchscore.measure.decide`) decides it once per
folder, records it as ``_batchscore/settled.json`` with its first commit, and every later run of
the folder reuses it, so one output never mixes precisions; the run report carries it too. In
the code it is a `Decision`; JSON only at the folder's edge (`Checkpoint.settled`, `settle`) and
the report's. The JSON is the one batchscore always wrote: what a measurement recorded beyond
the fields read here (its sample, its agreement with fp32) is kept as it came.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Chosen:
    """The precision the folder's rows are scored at, and why (the record's "precision")."""

    precision: str
    why: str
    trials: tuple[str, ...] = ()  # each precision measured, one line each, the reference first
    speeds: Mapping[str, float] = field(default_factory=dict)  # padded tokens/s of each timed
    accepted: bool = False  # it failed the gate and the job accepted it: later loads agree
    measured: Mapping[str, Any] = field(default_factory=dict)  # sample_rows, agreement, ...

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"precision": self.precision, "why": self.why}
        if self.trials:
            data["trials"] = list(self.trials)
        data.update(self.measured)
        if self.accepted:
            data["accepted"] = True
        if self.speeds:
            data["speeds"] = dict(self.speeds)
        return data

    def plainly(self, asked: str) -> str:
        """The choice in one plain line for a run's log (``why`` is its reasoning, for -v):
        its measured speed over fp32 and its agreement with fp32 on the gate's rows, e.g.
        ``2.60x fp32, cosine min 0.9999 on 256 rows``. ``asked``: the job's
        `[model].precision` ("auto" or the one it fixed)."""
        name, rows = self.precision, self.measured.get("sample_rows")
        whose = "" if asked == "auto" else "the job's: "
        if name == "fp32" and asked == "auto" and rows:
            return (
                "the reference: no faster precision passes the quality gate and pays for "
                f"itself on {rows:,} rows"
            )
        if name == "fp32" and asked == "fp32":
            return "the job's: the reference, nothing to gate"
        found = []
        fp32, own = self.speeds.get("fp32"), self.speeds.get(name)
        if name != "fp32" and fp32 and own:
            found.append(f"{own / fp32:.2f}x fp32")
        agreement = self.measured.get("agreement") or {}
        if agreement:  # the gate's own measure first (the threshold it is held to)
            metric, value = next(iter(agreement.items()))
            found.append(f"{metric.replace('_', ' ')} {value:.4f}")
        if not found:  # nothing measured: the reason is short (no rows, taken from footers)
            return whose + self.why
        failed = ": FAILS the quality gate, accepted" if self.accepted else ""
        return f"{whose}{', '.join(found)}{f' on {rows:,} rows' if rows else ''}{failed}"

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Chosen:
        rest = {k: v for k, v in data.items() if k not in FIELDS}
        return cls(
            data["precision"],
            data.get("why", ""),
            tuple(data.get("trials") or ()),
            dict(data.get("speeds") or {}),
            bool(data.get("accepted", False)),
            rest,
        )


FIELDS = ("precision", "why", "trials", "speeds", "accepted")


@dataclass(frozen=True)
class Budget:
    """The token budget ``max_tokens = "auto"`` settled on, and why (the record's "batching")."""

    max_tokens: int
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"max_tokens": self.max_tokens, "why": self.why}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Budget:
        return cls(data["max_tokens"], data.get("why", ""))


@dataclass(frozen=True)
class Decision:
    """Everything a folder settled on: its precision, its budget when it was "auto", and the
    calibration ranges of int8 / uint8 embeddings (each dimension's minimum, then maximum),
    measured on the job's first distinct rows when the job gave none."""

    precision: Chosen
    batching: Budget | None = None
    ranges: tuple[tuple[float, ...], ...] | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"precision": self.precision.to_json()}
        if self.batching is not None:
            data["batching"] = self.batching.to_json()
        if self.ranges is not None:
            data["ranges"] = [list(bound) for bound in self.ranges]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Decision:
        batching, ranges = data.get("batching"), data.get("ranges")
        return cls(
            Chosen.from_json(data["precision"]),
            Budget.from_json(batching) if batching is not None else None,
            tuple(tuple(float(v) for v in bound) for bound in ranges) if ranges else None,
        )
