"""Per-step view: 0.42 (full) / 0.40 (pilot) vs 0.50 at equal optimizer steps (0.50 interpolated in ln steps),
and the slopes per ln C before and after B in the full runs."""
from common import *
for s in DEV:
    B = record(s, 'pilot')['budget']
    X = curves(s, 'pilot-x1'); Fu = curves(s, 'full10')
    for lab, D, lo in (('pilot', X, 0.4), ('full ', Fu, 0.42)):
        a, b = D[lo], D[0.5]
        m = a['frac'] > 0.05
        yb = np.interp(np.log(a['steps'][m]), np.log(b['steps'][1:]), b['y'][1:])
        print(f"{s:15s} {lab} {lo} - 0.50 at equal steps (steps of {lo}): " + " ".join(f"{int(st)}:{d:+.3f}" for st, d in zip(a['steps'][m], a['y'][m] - yb)))
    print(f"{s:15s} full slope per ln C, [0.28B,0.93B] | [0.93B,10B]: " + "  ".join(
        f"{r:.2f}: {(d['y'][4]-d['y'][2])/np.log(d['C'][4]/d['C'][2]):.3f}|{(d['y'][8]-d['y'][4])/np.log(d['C'][8]/d['C'][4]):.3f}" for r, d in Fu.items()))
    print(f"{s:15s} pilot slope per ln C, [0.31B,B]: " + "  ".join(
        f"{r:.2f}: {(d['y'][-1]-d['y'][-3])/np.log(d['C'][-1]/d['C'][-3]):.3f}" for r, d in X.items()))
for s in EXTRA:
    Fu = curves(s, 'full10'); P = curves(s, 'pilot')
    print(f"{s:15s} full slope per ln C, [~0.3B,~B] | [~B,10B]: " + "  ".join(
        f"{r:.2f}: {(d['y'][4]-d['y'][2])/np.log(d['C'][4]/d['C'][2]):.3f}|{(d['y'][8]-d['y'][4])/np.log(d['C'][8]/d['C'][4]):.3f}" for r, d in Fu.items()))
    print(f"{s:15s} pilot slope per ln C, [0.31B,B]: " + "  ".join(
        f"{r:.2f}: {(d['y'][-1]-d['y'][-3])/np.log(d['C'][-1]/d['C'][-3]):.3f}" for r, d in P.items()))
