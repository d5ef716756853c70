"""The ``cas-checkpoint`` command (``pip install 'cas_checkpoint[cli]'``). It calls only the
public API; its bars and tables come from ``rich``, which the library itself never imports."""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    try:
        from cas_checkpoint.cli.app import main as run
    except ImportError as exc:
        if getattr(exc, "name", "") and str(exc.name).split(".")[0] == "rich":
            print("cas-checkpoint: error: the command line needs its extra: pip install "
                  "'cas_checkpoint[cli]'", file=sys.stderr)
            return 2
        raise
    return run(argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
