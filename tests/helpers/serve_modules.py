"""``ferryman serve`` in this process, writing the names of the modules it has loaded to a file
once it is serving (the start line is logged): ``python serve_modules.py OUT [serve args]``.

The service is started exactly as ``python -m ferryman serve`` starts it; the file is written
by a log handler of this script, so the service itself has nothing to add for it."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path


class _AtServing(logging.Handler):
    def __init__(self, out: Path) -> None:
        super().__init__()
        self.out = out

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("ferryman serving") and not self.out.exists():
            loaded = sorted(name for name, module in sys.modules.items() if module is not None)
            partial = self.out.with_suffix(".partial")
            partial.write_text(json.dumps(loaded), encoding="utf-8")
            partial.replace(self.out)


def main() -> int:
    out = Path(sys.argv[1])
    logging.getLogger("ferryman").addHandler(_AtServing(out))
    from ferryman.cli import main as ferryman

    return ferryman(["serve", *sys.argv[2:]])


if __name__ == "__main__":
    sys.exit(main())
