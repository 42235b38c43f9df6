"""The run report's counters: every field of `RunStats`, copied, with the rates derived."""

from __future__ import annotations

import dataclasses
import json

from batchscore.observe.report import RunStats


def test_the_report_holds_every_counter_and_does_not_share_the_stats_dicts():
    stats = RunStats(rows=10, tokens=120, computed_tokens=120, padded_tokens=150, wall_s=2.0)
    stats.committed("a.parquet", 6, 1, 0)
    stats.committed("b.parquet", 4, 0, 2)
    stats.timeline = {"at": [0.5, 1.0], "rows": [5, 10]}
    report = stats.report(job="j")
    stats.phases = {"preparing": 0.25, "scoring": 1.5}
    report = stats.report(job="j")
    skip = ("shape", "phases")
    expected = {k: v for k, v in dataclasses.asdict(stats).items() if k not in skip}
    assert {k: report[k] for k in expected} == expected
    # the wall time split: "finishing" is what the timed phases leave of it
    assert report["phases"] == {"preparing": 0.25, "scoring": 1.5, "finishing": 0.25}
    assert report["padding_efficiency"] == 0.8 and report["rows_per_s"] == 5.0
    assert report["job"] == "j" and json.loads(json.dumps(report)) == report
    stats.committed("a.parquet", 1, 0, 0)  # the run goes on: the report already made stays
    stats.timeline["at"].append(2.0)
    assert report["shards"]["a.parquet"]["rows"] == 6 and report["timeline"]["at"] == [0.5, 1.0]
