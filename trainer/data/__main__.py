import sys

from .inspect import main

sys.exit(main())
