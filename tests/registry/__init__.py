"""The registry's semantics: registrations, scopes, plans, changes, limits, callbacks."""
