"""Would RACE's own backtest (fit on checkpoints up to a cut, predict the pilot end) have preferred the
candidates? mae / contrast error on the pilots' end, and 0.40-vs-0.50 per-step efficiency ratio in the full runs."""
from q3_candidates import *
import q3_candidates as Q

def backtest(name, P, B, cut):
    Pc = {}
    for r, d in P.items():
        k = d['frac'] <= cut + 1e-9
        Pc[r] = {**d, 'frac': d['frac'][k], 'C': d['C'][k], 'steps': d['steps'][k], 'y': d['y'][k]}
        Pc[r]['end'] = (d['C'][-1], d['y'][-1])
    old = Q.FACT
    Q.FACT = np.array([np.exp(np.mean([np.log(Pc[r]['end'][0] / B) for r in P]))])
    try:
        pr = predict(name, Pc, B)
    finally:
        Q.FACT = old
    e = np.array([pr[r][0] - P[r]['y'][-1] for r in sorted(P)])
    return np.abs(e).mean(), np.abs(e - e.mean()).mean()

names = ['loglinear (RACE)', 'logit-linear (A=1), per-rho B', 'logit-linear (A=1), shared B', 'loglinear, slope linear in rho']
for s in DEV + EXTRA:
    kind = 'pilot-x1' if record(s, 'pilot-x1') is not None else 'pilot'
    P = curves(s, kind); B = float(record(s, kind)['budget'])
    for name in names:
        cells = []
        for cut in (0.56, 0.31, 0.17):
            try:
                m, c = backtest(name, P, B, cut); cells.append(f"cut {cut}: mae {m:.3f} contr {c:.3f}")
            except Exception as ex:
                cells.append(f"cut {cut}: fail")
        print(f"{s:15s} {name:34s} " + " | ".join(cells))
print()
for s in DEV:
    Fu = curves(s, 'full10'); a, b = Fu[0.42], Fu[0.5]
    m = a['frac'] > 0.05
    # steps the 0.50 mean curve needs to reach 0.42's value (monotone envelope, log-interp), / 0.42's steps
    env = np.maximum.accumulate(b['y'][1:]); st = b['steps'][1:]
    out = []
    for s42, y in zip(a['steps'][m], a['y'][m]):
        if y > env[-1]:
            out.append(f"{int(s42)}:>{st[-1]/s42:.2f}")
        else:
            j = np.searchsorted(env, y); j = max(j, 1)
            t = (y - env[j-1]) / max(env[j] - env[j-1], 1e-9)
            sreq = np.exp(np.log(st[j-1]) + t * (np.log(st[j]) - np.log(st[j-1])))
            out.append(f"{int(s42)}:{sreq/s42:.2f}")
    print(f"{s:15s} per-step efficiency of 0.42 vs 0.50 (steps 0.50 needs / steps 0.42 took): " + " ".join(out))
