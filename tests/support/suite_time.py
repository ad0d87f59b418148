"""The suite's time by part, printed at the end of every run (issue #19 budgets the Spark part:
"the Spark part of the suite stays under 8 minutes").

Each test's setup + call + teardown is summed (a module-scoped Spark session's start counts in
the first test that needs it, its stop in the last), by whether the test is marked `spark`.
"""
from __future__ import annotations

from collections import defaultdict

import pytest

SPARK = "spark"


class SuiteTime:
    def __init__(self) -> None:
        self.spark_ids: set[str] = set()
        self.seconds: dict[str, float] = defaultdict(float)   # nodeid -> s

    @pytest.hookimpl
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        self.spark_ids = {i.nodeid for i in items if i.get_closest_marker(SPARK) is not None}

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] += report.duration

    def parts(self) -> dict[str, tuple[int, float]]:
        spark = [s for n, s in self.seconds.items() if n in self.spark_ids]
        rest = [s for n, s in self.seconds.items() if n not in self.spark_ids]
        return {"spark": (len(spark), sum(spark)), "other": (len(rest), sum(rest))}

    def by_module(self, ids: set[str]) -> list[tuple[str, float]]:
        mods: dict[str, float] = defaultdict(float)
        for n, s in self.seconds.items():
            if n in ids:
                mods[n.split("::")[0]] += s
        return sorted(mods.items(), key=lambda m: -m[1])

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter) -> None:  # type: ignore[no-untyped-def]
        if not self.seconds:
            return
        tr = terminalreporter
        tr.section("suite time by part")
        for part, (n, s) in self.parts().items():
            tr.write_line(f"{part}: {n} tests, {s:.1f} s ({s / 60:.1f} min)")
        spark = self.by_module(self.spark_ids)
        if spark:
            tr.write_line("spark modules: " + ", ".join(f"{m} {s:.1f} s" for m, s in spark))


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SuiteTime(), "suite-time")
