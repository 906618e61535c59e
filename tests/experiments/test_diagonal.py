"""The diagonal-network claims: verdict wiring on planted curves, and the exact claims of the report section."""

import numpy as np
import pandas as pd

from ftlab.dln.regimes import REGIME_CORNERS
from ftlab.experiments import diagonal as D


def _planted(best_of_task: dict[str, str], alphas) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Theory curves where ``best_of_task[task]`` is lowest everywhere; sims = theory + seed noise."""
    rows, sims = [], []
    for task in D.TASKS:
        for name, (lam, g) in REGIME_CORNERS.items():
            level = 0.2 if name == best_of_task[task] else 0.6
            s = D._setting(task, lam, g)
            rows += [{**s, "alpha": float(a), "error": level * (1 - a)} for a in alphas]
            sims += [{**s, "alpha": float(a), "seed": sd, "sim_error": level * (1 - a) + 0.01 * sd,
                      "sim_converged": True} for a in alphas for sd in range(4)]
    return pd.DataFrame(rows), pd.DataFrame(sims)


def test_judge_tasks_follows_the_planted_winner():
    alphas = np.geomspace(0.005, 0.5, 9)
    theory, sims = _planted(D.CLAIMED, alphas)
    v = D.judge_tasks(theory, sims, alphas, alphas[::4])
    assert {t: r.verdict for t, r in v.items()} == {"shared": "reproduced", "new": "reproduced", "subset": "reproduced"}
    assert all(r["mean"] > 0 and r["lo"] > 0 for r in v["shared"].sim)  # paired sim contrasts agree in sign
    wrong = {"shared": "III", "new": "II", "subset": "I"}
    theory, sims = _planted(wrong, alphas)
    v = D.judge_tasks(theory, sims, alphas, alphas[::4])
    assert {r.verdict for r in v.values()} == {"reversed"}
    assert v["shared"].best == ["III"] * len(alphas)


def test_report_states_the_exact_claims_with_one_verdict_each(tmp_path):
    from ftlab.report import ReportContext
    from ftlab.report.dln import run, verdict_count

    md = run(ReportContext(out_dir=tmp_path, figures=("regimes",), workers=1))
    assert verdict_count(md) == {"reproduced": 2}
    assert D.CLAIMS["tradeoff"] in md and "| I | -1 | 0.001 |" in md
    assert (tmp_path / "dln" / "regime_map.png").exists() and (tmp_path / "dln" / "corners.csv").exists()
