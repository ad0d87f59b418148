"""bench/rate_sweep.py's pieces: the fit of fixed + marginal CPU, its variants' settings as the
cluster's own `--set` overrides, and the report."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import rate_sweep  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def test_fit_recovers_the_fixed_and_the_per_transaction_part() -> None:
    pts = [(tps, 120.0 + 0.05 * tps + noise) for tps, noise in
           ((300, 0.4), (600, -0.3), (1200, 0.2), (1800, -0.1))]
    fixed, marginal = rate_sweep.fit(pts)
    assert fixed == pytest.approx(120.0, abs=1.0)
    assert marginal == pytest.approx(0.05, abs=0.001)
    assert all(math.isnan(v) for v in rate_sweep.fit([(600, 1.0), (600, 2.0)]))


def test_a_variant_becomes_capture_settings_the_cluster_file_carries(tmp_path: Path) -> None:
    from sluice.ctl.cluster_config import load_spec

    name, sets = rate_sweep.parse_variant("g500:group-min-interval-ms=500,group-max-txns=1024")
    assert name == "g500"
    conf = tmp_path / "cluster.toml"
    conf.write_text(rate_sweep.CONFIG)
    spec = load_spec(conf, sets)      # what `sluice cluster up --set` does with them
    assert spec.capture.config == {"group-min-interval-ms": 500, "group-max-txns": 1024}
    for bad in ("g500", "g500:", "g500:group-min-interval-ms"):
        with pytest.raises(SystemExit, match="--variant"):
            rate_sweep.parse_variant(bad)


def test_the_report_gives_each_variant_its_fit_and_the_ratio_to_the_defaults(
        capsys: pytest.CaptureFixture[str]) -> None:
    def run(variant: str, scale: float) -> dict:
        windows = [{"rate": rate, "tps": float(rate), "load": 1.0,
                    "ms_s": {"capture": scale * (30 if rate == 0 else 100 + 0.05 * rate),
                             "pump-1": scale * (20 if rate == 0 else 40 + 0.01 * rate),
                             "mariadb": 500.0}}
                   for rate in (0, 300, 600)]
        return {"variant": variant, "run": 1, "windows": windows}
    rate_sweep.report([run("default", 1.0), run("fewer", 0.5)], ["default", "fewer"], [0, 300, 600])
    out = capsys.readouterr().out
    assert "| capture | 30.0 | 115.0 | 130.0 | 100.0 | 0.0500 |" in out
    assert "| pump-1 | 20.0 | 43.0 | 46.0 | 40.0 | 0.0100 |" in out
    assert "| pipeline | 50.0 | 158.0 | 176.0 | 140.0 | 0.0600 |" in out
    assert "mariadb" not in out     # the source database is not the pipeline
    assert "fewer / default (pipeline CPU ms/s, medians): idle: 0.50x, 300: 0.50x, 600: 0.50x" in out
