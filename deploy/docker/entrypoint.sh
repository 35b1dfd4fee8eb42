#!/bin/sh
# The container's entry point: `dsh-system-prompt serve`, configured from the environment.
#
#   DSP_LISTEN  where to listen (default 0.0.0.0:50051; unix:/run/dsp/dsp.sock for a socket)
#   DSP_CONFIG  the TOML config file; when unset, /etc/dsh-system-prompt/sidecar.toml is used
#               if it exists (mount one there), else the built-in defaults apply. A DSP_CONFIG
#               that names a missing file stops the sidecar (exit 2), as `serve --config` does.
#
# Arguments that start with '-' are added to `serve` and win over the above (argparse keeps
# the last value), e.g. `docker run IMAGE --log-format json`. Any other first argument is a
# dsh-system-prompt subcommand (`health --address ...`). `exec` makes the sidecar PID 1, so
# SIGTERM reaches it directly and it drains within shutdown_grace_s.
set -eu

DEFAULT_CONFIG=/etc/dsh-system-prompt/sidecar.toml

if [ "$#" -gt 0 ] && [ "${1#-}" = "$1" ] && [ "$1" != serve ]; then
    exec dsh-system-prompt "$@"
fi
if [ "$#" -gt 0 ] && [ "$1" = serve ]; then
    shift
fi

config=${DSP_CONFIG:-}
if [ -z "$config" ] && [ -f "$DEFAULT_CONFIG" ]; then
    config=$DEFAULT_CONFIG
fi
if [ -n "$config" ]; then
    set -- --config "$config" "$@"
fi
exec dsh-system-prompt serve --listen "${DSP_LISTEN:-0.0.0.0:50051}" "$@"
