"""Q1: pilot vs full-run checkpoint curves; agreement up to C=B; crossing of 0.42 and 0.50 in the full runs."""
from common import *
import sys
B = None
settings = sys.argv[1:] or DEV
for s in settings:
    P = curves(s, 'pilot'); X = curves(s, 'pilot-x1'); Fu = curves(s, 'full10')
    B = record(s, 'pilot')['budget']
    print(f"\n=== {s}  B={B:.3g}")
    print("pilot end (500 prompts, mean±se over seeds):", {r: f"{d['end500'].mean():.3f}±{d['end500'].std(ddof=1)/np.sqrt(d['n']):.3f}" for r, d in (X or P).items()})
    print("full end (500 prompts):", {r: f"{d['end500'].mean():.3f}±{d['end500'].std(ddof=1)/np.sqrt(d['n']):.3f}" for r, d in Fu.items()})
    print("-- pilot curves (pilot-x1 if present), C/B : mean reward on 100 ckpt prompts [steps]")
    for r, d in (X or P).items():
        print(f"  rho {r:.2f} steps/B {d['sched'].steps:5d} n_gen {d['sched'].n_gen} keep {d['sched'].n_train} mu {d['sched'].mu}: " +
              " ".join(f"{c/B:.3f}:{y:.3f}" for c, y in zip(d['C'], d['y'])))
    print("-- full curves, C/B : mean reward [se over seeds]")
    for r, d in Fu.items():
        se = d['ys'].std(0, ddof=1) / np.sqrt(d['n'])
        print(f"  rho {r:.2f} steps {d['sched'].steps:5d}: " + " ".join(f"{c/B:.2f}:{y:.3f}({e:.3f})" for c, y, e in zip(d['C'], d['y'], se)))
    print("-- full vs pilot at the same C (C<=B): full - pilot(interp in lnC); pilot 0.40 compared with full 0.42")
    for r, d in Fu.items():
        pr = 0.40 if abs(r - 0.42) < 1e-9 else r
        src = X if (X and pr in X) else P
        if pr not in src: continue
        p = src[pr]
        m = (d['C'] <= 1.001 * B) & (d['frac'] > 0)
        yp = np.interp(np.log(d['C'][m]), np.log(p['C'][1:]), p['y'][1:])
        diff = d['y'][m] - yp
        print(f"  rho {r:.2f}: " + " ".join(f"{c/B:.3f}:{dd:+.3f}" for c, dd in zip(d['C'][m], diff)) + f"   mean {diff.mean():+.3f}")
    if 0.42 in Fu and 0.5 in Fu:
        a, b = Fu[0.42], Fu[0.5]
        dd = a['y'] - b['y']
        se = np.sqrt(a['ys'].var(0, ddof=1) / a['n'] + b['ys'].var(0, ddof=1) / b['n'])
        print("-- full: 0.42 - 0.50 by fraction (C/B of 0.50):", " ".join(f"{c/B:.2f}:{x:+.3f}({e:.3f})" for c, x, e in zip(b['C'], dd, se)))
        # same-step comparison
        print("   steps 0.42:", a['steps'].astype(int).tolist(), " steps 0.50:", b['steps'].astype(int).tolist())
    # full-run ranking per checkpoint
    rhos = sorted(Fu)
    print("-- full: best rho per checkpoint:", " ".join(f"{Fu[rhos[0]]['C'][k]/B:.2f}:{rhos[int(np.argmax([Fu[r]['y'][k] for r in rhos]))]}" for k in range(1, len(Fu[rhos[0]]['C']))))
