"""The shared core (dsh_system_prompt_core): rendering, error reasons, stepping."""
