# The dsh-system-prompt sidecar. Build: docker build -t dsh-system-prompt .
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY client ./client
COPY server ./server
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --system --uid 10001 --no-create-home sidecar
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER sidecar
EXPOSE 50051
STOPSIGNAL SIGTERM
# Mount a config at /etc/dsh-system-prompt/sidecar.toml and add --config to use it.
ENTRYPOINT ["dsh-system-prompt", "serve"]
CMD ["--listen", "0.0.0.0:50051"]
