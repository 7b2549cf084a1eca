"""``python -m kstore.maintenance`` and ``spark-submit .../maintenance/__main__.py``.

Absolute imports only: spark-submit runs this file as a plain script.
"""

import os
import sys

if not __package__:
    # Run as a script: Python put this folder first on sys.path, which would make its modules
    # (main, service, ...) importable under generic top-level names. Only kstore.maintenance is meant.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]

from kstore.maintenance.main import main

if __name__ == "__main__":
    sys.exit(main())
