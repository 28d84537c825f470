# The portal image: web (uvicorn), Celery worker and beat, scheduler and — with the NVIDIA runtime — the node agent.
# Build: docker build -t gpu-portal .   (needs registry access for the base images; none is reachable in our CI)

FROM node:20-bookworm-slim AS frontend
WORKDIR /src/frontend
COPY frontend/package.json frontend/package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY frontend/ ./
RUN npm run build

FROM python:3.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
ARG WITH_TORCH=0
RUN useradd --create-home --uid 10001 portal
WORKDIR /app
COPY requirements.lock ./
# torch (for the GPU probe) is only needed in the agent image: build it with --build-arg WITH_TORCH=1.
RUN grep -v '^torch==' requirements.lock > /tmp/req.txt \
 && pip install --no-cache-dir -r /tmp/req.txt \
 && if [ "$WITH_TORCH" = "1" ]; then pip install --no-cache-dir "$(grep '^torch==' requirements.lock)"; fi
COPY . .
COPY --from=frontend /src/frontend/dist /app/frontend/dist
RUN pip install --no-cache-dir --no-deps -e . \
 && PORTAL_PRODUCTION=1 SECRET_KEY=build-only-not-secret-build-only-not-secret-build-only \
    ALLOWED_HOSTS=build STATIC_ROOT=/app/static python manage.py collectstatic --noinput -v 0
ENV STATIC_ROOT=/app/static PORTAL_PRODUCTION=1
USER portal
EXPOSE 8000
# WEB_PROCESSES uvicorn processes (one per core), each accepting on a socket of its own (portal/serve.py).
CMD ["python", "-m", "portal.serve", "--host", "0.0.0.0", "--port", "8000", "--ws-max-size", "65536"]
