"""`python -m reward_models.annotate ...`: see `reward_models.annotate`."""

import sys

from reward_models.annotate.cli import main

sys.exit(main())
