"""The read-only admin page (`--admin-listen`): scopes, prompts, cache history, sessions."""

from .http import AdminOptions, AdminServer, start_admin

__all__ = ["AdminOptions", "AdminServer", "start_admin"]
