"""The Python client (dsh_system_prompt) against real and scripted sidecars."""
