import os
import sys
from pathlib import Path

# At the repository root so it applies to tests/ and to `pytest --nbval chapters/...` alike.
# One intra-op thread by default (tests, and the kernels nbval starts, which inherit this
# environment), as tools/execute.py stores the outputs, so pytest-xdist's two workers use the
# two cores. A default only: the perturbed nbval legs set OMP_NUM_THREADS=2 (another reduction
# split) to prove that the stored outputs do not depend on it.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["PYTHONHASHSEED"] = "0"

ROOT = Path(__file__).resolve().parent
if str(ROOT) not in sys.path:  # so that tests can import tools/
    sys.path.insert(0, str(ROOT))
