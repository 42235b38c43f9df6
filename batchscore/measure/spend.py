"""What "auto" may spend on trying precisions: a pure policy over seconds and speeds, shared by
the run (`batchscore.measure.auto`) and `plan` (`batchscore.recipes.estimate`), so that both
weigh every candidate alike.

fp32 scores the gate's sample first, and the job's time is estimated from it: its load and pass,
and the rest of the job at its speed. A faster precision is then tried only when both hold,
judged before it runs from what it is expected to cost and save:

- it pays: what it would save on the rest of the job against the best so far exceeds what
  trying it costs (its load, int8's calibration, its own pass over the sample);
- it fits the budget: measuring (every second of trying that the run does not keep) stays
  within `TRIAL_SHARE` of that first estimate, whether the candidate wins (then the
  best-so-far's load and pass, and its own calibration, are what the run does not keep) or
  loses (then its load, calibration and pass are).

The rule holds by construction: a trial is admitted only if in both outcomes everything spent
so far plus its cost stays within the budget, and the estimate the budget is a share of counts
only the model's loads and passes, none of a run's start-up, reading or writing. The budget is
fixed before anything is tried, so a candidate that would make the job much faster is not
refused for making the job short. Among the candidates that qualify, the one with the largest
net benefit (saving minus cost) goes first, not the fastest: a cheap precision that is nearly as
fast (bf16, no calibration) comes before a faster one whose calibration this job cannot repay.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

TRIAL_SHARE = 0.10  # measuring may take at most this share of the job's first estimate


@dataclass(frozen=True)
class Prospect:
    """One precision as it is expected to run on this job, before it is tried."""

    name: str
    speedup: float  # padded tokens per second over fp32's
    load_s: float  # loading it, calibration left out
    calibrate_s: float  # its calibration on the sample, as expected (0: none)
    calibrate_max_s: float  # the most its calibration can take
    guessed: bool  # the speedup is the device's promise, not a measurement


@dataclass(frozen=True)
class Ledger:
    """Where the trying stands: the best precision so far and what has been spent.

    ``own_s`` is the best one's load and pass over the sample: the run's own work while it stays
    best, thrown away if another wins. ``sunk_s`` is every other second spent: measuring."""

    fp32_speed: float  # padded tokens per second, measured on the gate's pass
    sample_tokens: float  # padded tokens of the gate's sample
    left_tokens: float  # padded tokens the job scores beyond the sample
    own_s: float  # fp32's load and pass, to begin with
    best_speedup: float = 1.0  # the best one so far, over fp32
    sunk_s: float = 0.0
    budget_s: float = -1.0  # what measuring may take; set from the first estimate

    def __post_init__(self) -> None:
        if self.budget_s < 0:  # fp32's estimate of the job, before anything is tried
            object.__setattr__(self, "budget_s", TRIAL_SHARE * self.wall_s)

    @property
    def wall_s(self) -> float:
        """The model's part of the job's time if nothing more is tried: loads, passes, the rest."""
        return self.sunk_s + self.own_s + self.left_tokens / self.speed(self.best_speedup)

    def speed(self, speedup: float) -> float:
        return self.fp32_speed * max(speedup, 1e-9)

    def cost_s(self, prospect: Prospect, *, worst: bool = False) -> float:
        """Seconds trying ``prospect`` takes: its load, calibration and pass over the sample, as
        expected (``worst``: at the most)."""
        own_pass = self.sample_tokens / self.speed(prospect.speedup)
        calibration = prospect.calibrate_max_s if worst else prospect.calibrate_s
        return prospect.load_s + calibration + own_pass

    def after(
        self, *, won: bool, speedup: float = 1.0, cost_s: float, calibrate_s: float = 0.0
    ) -> Ledger:
        """The ledger once a precision was tried: ``cost_s`` is what trying it took (load,
        calibration and pass), ``calibrate_s`` of it calibration; when it ``won``, at
        ``speedup`` as measured, its load and pass are the run's own and the best-so-far's sunk."""
        if not won:
            return dataclasses.replace(self, sunk_s=self.sunk_s + cost_s)
        return dataclasses.replace(
            self,
            best_speedup=speedup,
            own_s=cost_s - calibrate_s,
            sunk_s=self.sunk_s + self.own_s + calibrate_s,
        )


@dataclass(frozen=True)
class Weighed:
    """A prospect weighed against the ledger."""

    prospect: Prospect
    saving_s: float  # on the rest of the job against the best so far, if it wins
    cost_s: float  # of trying it
    measuring_s: float  # measuring at the end, in the worse of its two outcomes
    budget_s: float  # what measuring may take (see `Ledger.budget_s`)
    against: float = 1.0  # the best so far, over fp32: what it would have to beat
    others: bool = True  # the job has rows beyond the gate's sample, for it to save time on

    @property
    def pays(self) -> bool:
        return self.saving_s > self.cost_s

    @property
    def fits(self) -> bool:
        return self.measuring_s <= self.budget_s

    @property
    def worth_trying(self) -> bool:
        return self.pays and self.fits

    @property
    def net_s(self) -> float:
        return self.saving_s - self.cost_s

    def describe(self) -> str:
        """Why it was not tried, for the decision record: never a negative saving (a
        candidate no faster than the best so far saves nothing; it costs time)."""
        p = self.prospect
        basis = "the device's guess" if p.guessed else "measured here before"
        head = f"{p.name}: not tried (at {p.speedup:.2f}x fp32, {basis}"
        if p.speedup <= self.against:
            best = "fp32" if self.against == 1.0 else f"the {self.against:.2f}x fp32 chosen"
            return f"{head}, it is no faster than {best})"
        if not self.others:
            return f"{head}, this job has no rows beyond the quality gate's sample to save on)"
        if not self.pays:
            saving = f"~{self.saving_s:.1f} s" if self.saving_s >= 0.05 else "under 0.1 s"
            return (
                f"{head}, it would save {saving} on this job's other rows; "
                f"trying it costs ~{self.cost_s:.1f} s)"
            )
        return (
            f"{head}, trying it would take measuring to ~{self.measuring_s:.1f} s, over the "
            f"~{self.budget_s:.1f} s ({TRIAL_SHARE:.0%} of this job) a run may spend)"
        )


def weigh(prospect: Prospect, ledger: Ledger) -> Weighed:
    """``prospect`` against the best so far: its saving and its expected cost, and measuring in
    the worse of its two outcomes at the most each can cost (it wins: the best-so-far's load
    and pass and its own calibration are not kept; it loses: its load, calibration and pass
    are not)."""
    left = ledger.left_tokens
    saving = left / ledger.speed(ledger.best_speedup) - left / ledger.speed(prospect.speedup)
    win = ledger.sunk_s + ledger.own_s + prospect.calibrate_max_s
    lose = ledger.sunk_s + ledger.cost_s(prospect, worst=True)
    return Weighed(
        prospect,
        saving,
        ledger.cost_s(prospect),
        max(win, lose),
        ledger.budget_s,
        against=ledger.best_speedup,
        others=ledger.left_tokens > 0,
    )


def next_to_try(prospects: list[Prospect], ledger: Ledger) -> tuple[Weighed | None, list[Weighed]]:
    """The prospect to try next, the largest net benefit among those worth trying (None when
    none is), and the others as weighed now."""
    weighed = sorted((weigh(p, ledger) for p in prospects), key=lambda w: -w.net_s)
    chosen = next((w for w in weighed if w.worth_trying), None)
    return chosen, [w for w in weighed if w is not chosen]
