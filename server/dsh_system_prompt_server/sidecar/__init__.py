"""The process: its config, the server built from it, reloads, and the command line.

Belongs here: the config file's keys and checks, listening, building and stopping the
gRPC server (with health, reflection, metrics and the admin page), SIGHUP and file-poll
reloads, and the `dsh-system-prompt` commands. It is the top of the package: it may import
every other folder, and none imports it.
"""
