"""``python -m kstore.compaction`` and ``spark-submit .../compaction/__main__.py``.

Absolute imports only: spark-submit runs this file as a plain script.
"""

import sys

from kstore.compaction.main import main

if __name__ == "__main__":
    sys.exit(main())
