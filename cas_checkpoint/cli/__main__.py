import sys

from cas_checkpoint.cli import main

sys.exit(main())
