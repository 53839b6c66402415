"""Bootstrap (prompts + seeds, 300 replicates) of the predicted 0.40-0.50 difference at 10B for the main candidates."""
from q3_candidates import *
names = ['loglinear (RACE)', 'loglinear, f>=0.30', 'loglinear, slope linear in rho', 'logit-linear (A=1), per-rho B',
         'logit-linear (A=1), shared B']
for s in DEV:
    P = curves(s, 'pilot-x1'); B = float(record(s, 'pilot-x1')['budget'])
    reps = boot_means(P, 300, seed=1)
    for name in names:
        pt = predict(name, P, B); d0 = pt[0.4][3] - pt[0.5][3]
        bd = np.array([(lambda q: q[0.4][3] - q[0.5][3])(predict(name, P, B, rep)) for rep in reps])
        print(f"{s:15s} {name:34s} 0.40-0.50 at 10B: {d0:+.3f}  boot SE {bd.std():.3f}  90% [{np.quantile(bd,.05):+.3f},{np.quantile(bd,.95):+.3f}]  P(>=0) {np.mean(bd>=0):.2f}")
