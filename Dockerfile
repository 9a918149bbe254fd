# The image of docker-compose.yml's worker, simulator and metrics exporter: the package with
# its celery, simulator and prometheus extras, and the examples.
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONPATH=/app

WORKDIR /app
COPY pyproject.toml README.md ./
COPY polygate_celery ./polygate_celery
RUN pip install '.[celery,simulator,prometheus]'
COPY examples ./examples

# Run unprivileged (Celery warns about a worker running as root).
RUN useradd --create-home --uid 10001 polygate
USER polygate

CMD ["celery", "-A", "examples.pipeline.tasks", "worker", "--loglevel", "INFO"]
