import sys

from rlstack.cli import main

sys.exit(main())
