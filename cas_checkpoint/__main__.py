"""``python -m cas_checkpoint``: the ``cas-checkpoint`` command, for where the script is not
on ``PATH`` (a virtualenv not activated, ``pipx run``)."""

import sys

from cas_checkpoint.cli import main

sys.exit(main())
