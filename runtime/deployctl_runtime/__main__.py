import sys

from deployctl_runtime.cli import main

sys.exit(main())
