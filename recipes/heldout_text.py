"""The held-out text of a recipe: the last 5% of each file, as `--eval-fraction 0.05` held it out.

    python recipes/heldout_text.py OUT.txt FILE...
"""

import sys

parts = []
for path in sys.argv[2:]:
    text = open(path, encoding="utf-8").read()
    parts.append(text[int(len(text) * 0.95):])
open(sys.argv[1], "w", encoding="utf-8").write("\n".join(parts))
