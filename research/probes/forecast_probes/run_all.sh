#!/bin/sh
# Every number of docs/validation.md's "why the forecast misses the move" (docs/forecast.md too), from the
# committed validation data of the development half only; ~30 s CPU in total. Run from anywhere with the
# project's venv active: sh research/probes/forecast_probes/run_all.sh (writes *_out.txt beside the scripts).
cd "$(dirname "$0")"
P="env OMP_NUM_THREADS=1 nice -n 15 python"
$P q1_curves.py                   > q1_out.txt        # Q1 default structured default-cosine
$P q1_curves.py steps-sparse generate > q1_out_extra.txt
$P seeds.py                       > seeds_out.txt     # per-seed curves of 0.42 / 0.50 in the full runs
$P q2_forecast.py                 > q2_out.txt        # Q2: race.stats.forecast (force, n_boot 200) + both models at 1.68/3.05/5.52/10 B
$P q2_steps.py                    > q2_steps_out.txt  # equal-step comparison, slopes before/after B
$P kappa.py                       > kappa_out.txt     # pass-rate dispersion, signal share s_n
$P q3_candidates.py               > q3_out.txt        # Q3: candidate models vs full runs
$P q3_boot.py                     > q3_boot_out.txt   # bootstrap of the 0.40-0.50 prediction
$P q3_backtest.py                 > q3_backtest_out.txt  # RACE-style backtests of the candidates
