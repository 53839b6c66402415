"""Base pass rates of a validation suite's settings, before any of their runs (issue 48: "check each base
policy's pass rate first, and replace any setting whose pilots would learn nothing").

    python research/scripts/passrate.py --suite research/validation/round3.yaml

Per setting: race.engine.calibration.calibrate on its full-run config (64 training prompts × 4 samples, seed 0),
the base policy's pass rate on training prompts (the answer check of its reward), and the share of groups of
n = 8 with any reward variance that pass rate implies, 1 − p⁸ − (1 − p)⁸ (GRPO learns nothing from a group
whose rollouts all score the same; Aphale & Liu, arXiv 2606.18487, put the useful floor near p ≈ 0.083).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "research" / "scripts"))

FLOOR, CEILING = 0.083, 0.95


def main(argv=None) -> int:
    import validation as v

    from race.engine.calibration import calibrate
    from race.config.configfile import config_from_dict

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--suite", default=str(ROOT / "research" / "validation" / "round3.yaml"))
    ap.add_argument("--only", default=None)
    args = ap.parse_args(argv)
    suite = v.load_suite(Path(args.suite))
    kind = v.kinds_of(suite)[0]
    print(f"{'setting':<18} {'pass rate':>9} {'groups of 8 with variance':>26}  verdict")
    for s in suite["settings"]:
        if args.only and s["name"] not in args.only.split(","):
            continue
        cfg = config_from_dict(v.grid_config(s, kind, 1, suite=suite))
        p = calibrate(cfg).pass_rate
        mixed = 1 - p ** 8 - (1 - p) ** 8
        verdict = "learns nothing (too hard)" if p < FLOOR else "saturated" if p > CEILING else "ok"
        print(f"{s['name']:<18} {p:>9.3f} {mixed:>26.3f}  {verdict}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
