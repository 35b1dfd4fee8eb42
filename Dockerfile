# The dsh-system-prompt gRPC sidecar.
#
#   make image                 # dsh-system-prompt:VERSION, offline, with docker or podman
#   docker run --rm -p 50051:50051 \
#       -v "$PWD/sidecar.toml:/etc/dsh-system-prompt/sidecar.toml:ro" dsh-system-prompt:0.1.0
#
# Offline (air-gapped) builds: `make wheelhouse` puts every wheel the image installs into
# wheelhouse/ (the project's, built on the host, and its dependencies for the image's Python
# and CPU); this file then installs from there with `pip install --no-index`, so
# `docker build --network none -t dsh-system-prompt:0.1.0 .` needs only this folder and the
# base image (`make image` does both). With an empty wheelhouse, a plain `docker build .`
# builds the wheels from PyPI instead. PYTHON_IMAGE picks the build stage's image: any
# Debian-like image with Python 3.11, `python` on PATH, the venv module and, to strip the
# wheels' extension modules, binutils (scripts/image-base.sh makes one with debootstrap when
# python:3.11-slim cannot be pulled). With podman, build with `--format docker`: the OCI
# format has no HEALTHCHECK.
#
# `make image-test` builds it so and runs it as the manifests in deploy/kubernetes/ do (read
# the README there): the health check, uid 10001 on a read-only root with no capabilities,
# the two pods, a ConfigMap edit, SIGTERM and a restart. `make bench-image` measures it.
#
# Configuration (deploy/docker/entrypoint.sh): DSP_LISTEN (default 0.0.0.0:50051), DSP_CONFIG
# (default: /etc/dsh-system-prompt/sidecar.toml when mounted, else built-in defaults), and any
# `serve` flags as arguments (`docker run IMAGE --log-format json`). When DSP_LISTEN moves,
# set DSP_HEALTH_ADDRESS to match (e.g. unix:/run/dsp/dsp.sock) so the HEALTHCHECK follows.
# The final stage is distroless (deploy/docker/rootfs.py): the build stage's Python, the
# libraries it links, dash and five tools, from its Debian packages, with the venv; no package
# manager, no perl. Its layers: system (interpreter, standard library, libraries, shell, /etc),
# dependencies (the server extra's third-party packages), then the project and the entry point.
# The runtime stage, the first two, is the base the image names (scripts/image.sh tags it
# dsh-system-prompt-runtime:VERSION): a release that changes no pin ships only the top layer.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
# What the wheel is built from: pyproject's readme, the licence, its packages (core/, client/,
# server/) and the contract their stubs' folder links to; the server extra brings the sidecar's
# dependencies.
COPY pyproject.toml README.md LICENSE ./
COPY proto ./proto
COPY core ./core
COPY client ./client
COPY server ./server
# wheelhouse/ holds only its README in a clone; `make wheelhouse` fills it with every wheel the
# image needs, and then nothing here touches an index (`make image` builds with --network none).
# Without wheels, they are built here from PyPI.
COPY wheelhouse ./wheelhouse
# pip and setuptools go once the install is done; rootfs.py compiles every module (the root
# filesystem is read-only, so Python could never write a pyc later).
RUN python -m venv /opt/venv \
    && if ! ls wheelhouse/*.whl >/dev/null 2>&1; then \
        /opt/venv/bin/pip wheel --wheel-dir wheelhouse '.[server]'; fi \
    && /opt/venv/bin/pip install --no-compile --no-index --find-links wheelhouse \
        'dsh-system-prompt[server]' \
    && /opt/venv/bin/pip uninstall --yes pip setuptools
COPY deploy/docker/entrypoint.sh /usr/local/bin/dsp-entrypoint
COPY deploy/docker/rootfs.py ./
# Cuts /rootfs/system, /rootfs/dependencies and /rootfs/project out of this stage, then runs
# the sidecar's imports and --help in a chroot of them; prints what each part weighs.
RUN chmod 0755 /usr/local/bin/dsp-entrypoint \
    && python rootfs.py /opt/venv /rootfs

FROM scratch AS runtime
COPY --from=build /rootfs/system/ /
COPY --from=build /rootfs/dependencies/ /

FROM runtime
ARG RUNTIME_IMAGE=dsh-system-prompt-runtime
# base.name says what the image is built on (make image-test measures what it adds).
LABEL org.opencontainers.image.title="dsh-system-prompt" \
      org.opencontainers.image.base.name="${RUNTIME_IMAGE}" \
      org.opencontainers.image.description="The dsh-system-prompt registry served as a gRPC sidecar" \
      org.opencontainers.image.licenses="MIT"
COPY --from=build /rootfs/project/ /
COPY --from=build /usr/local/bin/dsp-entrypoint /usr/local/bin/dsp-entrypoint
ENV PATH=/opt/venv/bin:/usr/local/bin:/usr/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    DSP_LISTEN=0.0.0.0:50051 \
    DSP_HEALTH_ADDRESS=127.0.0.1:50051
# A numeric non-root user (in the image's /etc/passwd), so Kubernetes' runAsNonRoot can
# verify it without runAsUser.
USER 10001:10001
EXPOSE 50051
STOPSIGNAL SIGTERM
# The standard grpc.health.v1 check through the CLI (exempt from auth; exit 0 when SERVING).
# Its own --timeout stays under Docker's, so a hung check reports itself; its other exit
# codes (3: NOT_SERVING or unreachable) are folded into 1, the "unhealthy" Docker defines.
# The shell (dash) is there for this expansion and fold, and for the entry point's defaults.
# A sidecar serving TLS needs the check's --tls-ca too: override with --health-cmd.
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["/bin/sh", "-c", "dsh-system-prompt health --address \"$DSP_HEALTH_ADDRESS\" --timeout 3 || exit 1"]
ENTRYPOINT ["dsp-entrypoint"]
CMD ["serve"]
