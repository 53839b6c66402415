import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

TINY_MODEL = os.path.join(ROOT, "race", "assets", "tiny-arith")
PILOTS = os.path.join(ROOT, "pilots")
