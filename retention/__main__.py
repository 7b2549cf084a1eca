"""``python -m kstore.retention`` and ``spark-submit .../retention/__main__.py``.

Absolute imports only: spark-submit runs this file as a plain script.
"""

import sys

from kstore.retention.main import main

if __name__ == "__main__":
    sys.exit(main())
