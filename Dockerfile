# syntax=docker/dockerfile:1
# ferryman: `ferryman serve` on 8080 (HTTP: /healthcheck, /json), 8081 (gRPC: Envoy's
# RateLimitService, ferryman.v1.Limiter, health) and 6070 (debug: /rlconfig, /stats; on the
# container's loopback unless DEBUG_HOST says otherwise).
#
#   docker build -t ferryman:0.1.0 \
#     --build-arg REVISION="$(git rev-parse HEAD)" \
#     --build-arg SOURCE="$(git remote get-url origin)" .
#   docker run --rm -p 8080:8080 -p 8081:8081 -p 6070:6070 -e DEBUG_HOST=0.0.0.0 ferryman:0.1.0
#
# It serves the example limits in /app/descriptors; mount your own over that directory, pass
# `serve --config DIR`, or set RUNTIME_ROOT / RUNTIME_SUBDIRECTORY as for envoyproxy/ratelimit.
# tests/test_dockerfile.py lints this file and runs its pip steps in a clean virtualenv.

FROM python:3.11.14-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY service/ service/
RUN python -m pip install --no-cache-dir --no-compile setuptools==84.2.1 \
 && python -m pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels .

FROM python:3.11.14-slim-bookworm
# The OCI labels: VERSION is the package's (service/ferryman/_version.py, checked by the tests);
# REVISION (the commit) and SOURCE (the repository's URL) come from the build command.
ARG VERSION=0.1.0
ARG REVISION=""
ARG SOURCE=""
LABEL org.opencontainers.image.title="ferryman" \
      org.opencontainers.image.description="A rate limit service for service meshes" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=build /wheels /wheels
# Every distribution is pinned and installed without resolution (--no-deps), so two builds
# hold the same code; `pip check` fails the build if the list misses a dependency.
# xds-protos carries an older copy of opentelemetry-proto's modules: opentelemetry-proto is
# installed again last, so that its own files are the ones the OTLP exporters import.
RUN python -m pip install --no-cache-dir --no-deps \
      certifi==2026.5.20 \
      charset-normalizer==3.4.7 \
      googleapis-common-protos==1.76.0 \
      grpcio==1.85.1 \
      grpcio-health-checking==1.85.1 \
      hiredis==3.5.0 \
      idna==3.13 \
      opentelemetry-api==1.45.2 \
      opentelemetry-exporter-http-transport==0.66b2 \
      opentelemetry-exporter-otlp-common==0.66b2 \
      opentelemetry-exporter-otlp-proto-common==1.45.2 \
      opentelemetry-exporter-otlp-proto-grpc==1.45.2 \
      opentelemetry-exporter-otlp-proto-http==1.45.2 \
      opentelemetry-propagator-b3==1.45.1 \
      opentelemetry-proto==1.45.2 \
      opentelemetry-sdk==1.45.2 \
      opentelemetry-semantic-conventions==0.66b2 \
      protobuf==7.36.2 \
      pyyaml==6.0.3 \
      redis==8.1.0 \
      requests==2.34.2 \
      typing-extensions==4.16.0 \
      tzdata==2026.6 \
      urllib3==2.7.0 \
      uvloop==0.23.0 \
      watchdog==7.1.0 \
      xds-protos==1.85.0 \
      /wheels/ferryman-*-py3-none-any.whl \
 && python -m pip install --no-cache-dir --no-deps --force-reinstall opentelemetry-proto==1.45.2 \
 && python -m pip check \
 && rm -rf /wheels
# envoyproxy/ratelimit's manifests (Istio's rate limit guide among them) run /bin/ratelimit
# with no arguments: here that is `ferryman serve`, configured by the same variables.
RUN printf "#!/bin/sh\nexec ferryman serve \"\$@\"\n" > /bin/ratelimit \
 && chmod 0755 /bin/ratelimit \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin ferryman
WORKDIR /app
COPY descriptors/ descriptors/
USER 10001
EXPOSE 8080 8081 6070
# HTTPS when GRPC_SERVER_USE_TLS is set (the probe asks its own loopback: nothing to verify).
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD ["python", "-c", "import os, ssl, urllib.request; tls = os.environ.get('GRPC_SERVER_USE_TLS', '') in ('1', 't', 'T', 'true', 'True', 'TRUE'); urllib.request.urlopen(('https' if tls else 'http') + '://127.0.0.1:%s/healthcheck' % os.environ.get('PORT', '8080'), timeout=2, context=ssl._create_unverified_context() if tls else None)"]
ENTRYPOINT ["ferryman"]
CMD ["serve"]
