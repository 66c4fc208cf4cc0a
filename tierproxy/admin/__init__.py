"""Admin HTTP API (FastAPI on uvicorn), Prometheus metrics and the admin CLI."""
