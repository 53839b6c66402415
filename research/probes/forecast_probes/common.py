"""Shared loading: per setting/kind/rho, checkpoint curves (mean over seeds) on the 100 checkpoint prompts."""
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[3]          # the checkout: its research/scripts/validation.py and race/
sys.path[:0] = [str(_ROOT / "research" / "scripts"), str(_ROOT)]
import numpy as np
import validation as V

DEV = ['default', 'structured', 'default-cosine']
EXTRA = ['steps-sparse', 'generate']
_cache = {}

def record(s, kind):
    k = (s, kind)
    if k not in _cache:
        _cache[k] = V.load_run(s, kind)
    return _cache[k]

def curves(s, kind):
    """rho -> dict(frac, C, steps, prompts, y (mean over seeds), ys (per seed), end500 (per seed mean on 500), lr)"""
    rec = record(s, kind)
    if rec is None:
        return None
    by = {}
    for p in V.pilots_of(rec):
        by.setdefault(p.rho_target, []).append(p)
    out = {}
    for rho, ps in sorted(by.items()):
        fr = sorted(set.intersection(*[{round(c.fraction, 6) for c in p.checkpoints} for p in ps]))
        C, st, ys, sc_ = [], [], [], []
        for p in sorted(ps, key=lambda p: p.seed):
            cp = {round(c.fraction, 6): c for c in p.checkpoints}
            C.append([cp[f].flops.total for f in fr])
            st.append([cp[f].step for f in fr])
            ys.append([cp[f].score('reward') for f in fr])
            sc_.append([cp[f].evals['reward'] for f in fr])
        sc = ps[0].schedule
        out[rho] = dict(frac=np.array(fr), scores=np.array(sc_, dtype=float), C=np.mean(C, 0), steps=np.mean(st, 0), ys=np.array(ys),
                        y=np.mean(ys, 0), prompts=np.mean(st, 0) * sc.prompts_per_step,
                        end500=np.array([p.score('reward') for p in ps]), sched=sc, n=len(ps),
                        rho_m=float(np.mean([p.rho for p in ps])))
    return out
