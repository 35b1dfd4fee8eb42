"""The read-only admin page (`--admin-listen`): scopes, prompts, cache history, sessions.

Belongs here: the aiohttp app and its guard, signing in, live views, paging, the views' values,
the Jinja2 templates (`templates/`) and the page's CSS and script (`static/`). It reads the
`ServerState`, never the servicer or the config (the sidecar hands it `AdminOptions`), and may
import only the folders before it in `LAYERS` in tests/package/test_package.py.
"""

from .http import AdminOptions, AdminServer, start_admin

__all__ = ["AdminOptions", "AdminServer", "start_admin"]
