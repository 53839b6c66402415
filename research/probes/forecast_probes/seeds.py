from common import *
for s in DEV:
    F = curves(s,'full10'); B = record(s,'pilot')['budget']
    for r in (0.42, 0.5):
        d = F[r]
        print(s, r, 'per-seed ckpt curves:'); 
        for y in d['ys']: print('   ', ' '.join(f"{v:.3f}" for v in y))
        print('    end500 per seed', np.round(d['end500'],3))
