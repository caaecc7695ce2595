# The scheduler image (compose.yaml). EXTRAS picks optional dependencies:
# `cockroachdb` (alembic through sqlalchemy-cockroachdb; the default), plus
# `bench` for the benchmark service.
FROM python:3.11-slim
ARG EXTRAS=cockroachdb
WORKDIR /app
COPY . /app
RUN pip install --no-cache-dir -e ".[${EXTRAS}]"
# /metrics, /healthz, /readyz with `scheduler node --metrics-host 0.0.0.0 --metrics-port 9464`
EXPOSE 9464
ENTRYPOINT []
CMD ["scheduler", "--help"]
