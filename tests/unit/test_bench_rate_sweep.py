"""bench/rate_sweep.py's pieces: the fit of fixed + marginal CPU, its variants' settings, and the
cluster file they make, loaded through the cluster's own config classes."""
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
    assert name == "g500" and sets == {"group-min-interval-ms": "500", "group-max-txns": "1024"}
    conf = tmp_path / "cluster.toml"
    conf.write_text(rate_sweep.capture_toml(sets))
    spec = load_spec(conf)
    assert spec.capture.config == {"group-min-interval-ms": 500, "group-max-txns": 1024}
    assert rate_sweep.capture_toml({}) == rate_sweep.CONFIG
    for bad in ("g500", "g500:", "g500:group-min-interval-ms"):
        with pytest.raises(SystemExit, match="--variant"):
            rate_sweep.parse_variant(bad)
