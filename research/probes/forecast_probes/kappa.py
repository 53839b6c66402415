"""Per-prompt pass-rate dispersion: fit p ~ Beta(mean R, concentration kappa) to the 4-sample held-out
scores at each checkpoint (method of moments on the beta-binomial), and the signal share
s_n(R) = 1 - E[p^n] - E[(1-p)^n] (a group of n rollouts has a correct and a wrong one)."""
from common import *
from scipy.special import betaln
def kappa_mom(scores, m=4):
    k = np.asarray(scores) * m
    R = k.mean() / m
    v = k.var(ddof=1)
    # beta-binomial: var = m R(1-R) (kappa+m)/(kappa+1)
    r = v / (m * R * (1 - R))
    return R, (m - r) / (r - 1) if r > 1 else np.inf
def s_n(R, kap, n):
    a, b = R * kap, (1 - R) * kap
    return 1 - np.exp(betaln(a + n, b) - betaln(a, b)) - np.exp(betaln(a, b + n) - betaln(a, b))
if __name__ == '__main__':
    for s in DEV:
        rec = record(s, 'full10')
        ks = []
        for p in V.pilots_of(rec):
            for c in p.checkpoints:
                R, k = kappa_mom(c.evals['reward'])
                ks.append((R, k))
        ks = np.array(ks); ks = ks[np.isfinite(ks[:, 1])]
        for lo, hi in [(0.25, 0.45), (0.45, 0.6), (0.6, 0.75), (0.75, 0.9)]:
            m = (ks[:, 0] >= lo) & (ks[:, 0] < hi)
            print(f"{s:15s} R in [{lo},{hi}): n={m.sum():3d} median kappa {np.median(ks[m,1]):.2f}")
    for R in (0.45, 0.55, 0.65, 0.75, 0.82):
        print(f"R={R}: " + " ".join(f"s_{n}={s_n(R, 1.5, n):.3f}" for n in (8, 12, 13, 25)) + f"  s12/s8={s_n(R,1.5,12)/s_n(R,1.5,8):.3f}")
