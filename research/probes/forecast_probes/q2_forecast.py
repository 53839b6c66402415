"""Q2: race.stats.forecast's prediction per rho at 1.7B, 3B, 5.5B, 10B vs the full runs' checkpoint means
(100 checkpoint prompts, mean over 3 seeds). Pilot rho 0.40 is compared with full rho 0.42."""
import sys, math
from common import *
import race.stats.curvefit as RCF
import race.stats.curves as RC
import race.stats.forecast as RF
from race.core.records import Regime

FACT = [1.68, 3.05, 5.52, 10.0]   # the full runs' checkpoint positions (C/B) past B

def full_at(Fu, rho, B):
    """full-run checkpoint means at the 4 checkpoints past B (per rho), keyed by fraction."""
    r = 0.42 if abs(rho - 0.40) < 1e-9 else rho
    if r not in Fu: return None
    d = Fu[r]; m = d['frac'] > 0.1
    return d['C'][m] / B, d['y'][m]

def run(s, kind, nboot=200, out=print):
    rec = record(s, kind); Fu = curves(s, 'full10'); B = float(rec['budget'])
    pilots = V.pilots_of(rec)
    cur = RC.collect_curves([(pilots, B)], 'reward')
    means = [g.mean for g in cur.groups]; r0 = float(RC.base_score(cur, means))
    fc = RF.forecast([(pilots, B)], target='reward', full_run_budget=10 * B, pilot_regime=Regime.SEARCH_HEAVY,
                     pilot_best_rho=0.5, force=True, n_boot=nboot)
    out(f"\n=== {s} [{kind}] model chosen: {fc.model} (shared slope {fc.shared_slope}), status {fc.status}, "
        f"f*={fc.supported_factor}, best rho at 10B: {fc.best_rho}, regime {fc.regime.value if fc.regime else None}")
    out("  backtests (model cut factor mae contrast held):")
    for b in fc.backtests:
        out(f"    {b.model:9s} {b.cut_fraction:.3f} {b.factor:5.2f}x mae {b.mae:.3f} contrast {b.contrast_mae:.3f} "
            f"half-spread {b.spread/2:.3f} {'held' if b.held else 'NOT'} errs {' '.join(f'{e:+.3f}' for e in b.errors)}")
    res = {}
    for model in ('loglinear', 'sigmoid'):
        fit = RCF.fit_surface(model, RC.fit_data(cur, means), r0, unit=cur.unit)
        out(f"  -- {model} fit on all checkpoints" + (f" (shared B={fit.shared})" if model == 'sigmoid' else '') +
            "; per rho: params | predicted (full measured) at C/B = " + " ".join(f"{f:g}" for f in FACT))
        for i, rho in enumerate(cur.points):
            fa = full_at(Fu, rho, B)
            par = fit.described(i, B)
            ptxt = (f"b={par['b']:.4f}" if model == 'loglinear' else f"A={par['A']:.3f} Cmid/B={par['c_mid']/B:.3g} B={par['B']:.2f}")
            preds = [float(fit.predict(math.log(f))[i]) for f in FACT]
            meas = list(fa[1]) if fa else [float('nan')] * 4
            res[(model, rho)] = (preds, meas)
            out(f"    rho {rho:.2f} {ptxt:34s} " + " ".join(f"{p:.3f}({m:.3f})" for p, m in zip(preds, meas)))
        # decomposition at each factor over the rho in both grids
        both = [r for r in cur.points if full_at(Fu, r, B) is not None]
        for k, f in enumerate(FACT):
            e = np.array([res[(model, r)][0][k] - res[(model, r)][1][k] for r in both])
            pr = {r: res[(model, r)][0][k] for r in both}; ms = {r: res[(model, r)][1][k] for r in both}
            out(f"     at {f:5.2f}B: level err {e.mean():+.3f}, contrast err {np.abs(e - e.mean()).mean():.3f}; "
                f"pred best {max(pr, key=pr.get)}, meas best {max(ms, key=ms.get)}" +
                (f"; 0.40-0.50 pred {pr[0.4]-pr[0.5]:+.3f} vs full 0.42-0.50 {ms[0.4]-ms[0.5]:+.3f}" if 0.4 in pr else ''))
    out("  forecast() at 10B, predicted (90% CI): " + "; ".join(
        f"{p.rho_target:.2f}: {p.predicted:.3f} ({p.predicted_ci[0]:.3f}..{p.predicted_ci[1]:.3f})" for p in fc.points))
    return fc

if __name__ == '__main__':
    for s in (sys.argv[1:] or DEV):
        for kind in ('pilot', 'pilot-x1'):
            if record(s, kind) is not None:
                run(s, kind)
