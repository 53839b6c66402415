import sys, pickle
from common import capture
which, n = sys.argv[1], int(sys.argv[2])
rec = capture(which, n)
pickle.dump(rec, open(f"rec_{which}.pkl", "wb"))
print(which, len(rec["sample"]), [tuple(b.completion_ids.shape) + (b.prompt_ids.shape[1],) for b, _ in rec["update"]])
print([ (len(p), kw) for p, kw in rec["sample"][:1]])
