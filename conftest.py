import os
import sys
from pathlib import Path

# At the repository root so it applies to tests/ and to `pytest --nbval chapters/...` alike.
# One intra-op thread everywhere (tests, and the kernels nbval starts, which
# inherit this environment), exactly as tools/execute.py stores the outputs:
# the same float results bit for bit, and pytest-xdist's two workers use the two cores.
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["PYTHONHASHSEED"] = "0"

ROOT = Path(__file__).resolve().parent
if str(ROOT) not in sys.path:  # so that tests can import tools/
    sys.path.insert(0, str(ROOT))
