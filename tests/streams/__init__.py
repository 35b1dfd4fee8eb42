"""The streams: sessions, listeners, part slots, watches, prompts in flight."""
