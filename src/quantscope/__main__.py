"""python -m quantscope"""

import sys

from quantscope.cli import main

sys.exit(main())
