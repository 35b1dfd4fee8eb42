"""The read-only admin page (`--admin-listen`): scopes, prompts, cache history, sessions."""

from .http import AdminServer, start_admin

__all__ = ["AdminServer", "start_admin"]
