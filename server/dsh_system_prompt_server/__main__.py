"""`python -m dsh_system_prompt_server serve ...`, the same as `dsh-system-prompt`."""

import sys

from .sidecar import main

sys.exit(main())
