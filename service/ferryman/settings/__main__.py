"""``python -m ferryman.settings --markdown``: print the settings page of the docs."""

from __future__ import annotations

import argparse

from ferryman.settings.table import COMMAND, markdown


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ferryman.settings",
        description=f"Print the settings page, in Markdown ({COMMAND}).",
    )
    parser.add_argument("--markdown", action="store_true", required=True)
    parser.parse_args()
    print(markdown(), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
