"""The `dsh-system-prompt` command's entry point: says what to install when the
client-only distribution lacks the sidecar's dependencies (the `server` extra)."""

from __future__ import annotations

import sys

EXIT_USAGE = 2


def main() -> int:
    """Run the CLI, or explain that it needs `dsh-system-prompt[server]`."""
    try:
        from . import cli  # the sidecar's dependencies load here
    except ModuleNotFoundError as error:
        print(
            f"dsh-system-prompt: the command needs the server extra (missing {error.name}):"
            " pip install 'dsh-system-prompt[server]'",
            file=sys.stderr,
        )
        return EXIT_USAGE
    return cli.main()
