"""The FastAPI app: `uvicorn api.main:app` (or `ledger serve`).

Only assembles: settings, the lifespan that opens the pools, the error handlers (api.errors: one
error shape, store failures as 503 naming the store) and one router per resource.
"""

from __future__ import annotations

from contextlib import asynccontextmanager

from elasticsearch import AsyncElasticsearch
from fastapi import FastAPI
from psycopg_pool import AsyncConnectionPool

from api.errors import install_error_handlers
from api.routes import api_router
from producers.settings import Settings, get_settings


def _configure(schema: str):
    async def configure(conn) -> None:
        await conn.execute(f'SET search_path TO "{schema}", public')
        await conn.commit()

    return configure


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.settings = settings
        pool = AsyncConnectionPool(
            settings.pg_dsn,
            min_size=1,
            max_size=settings.pg_pool_size,
            configure=_configure(settings.pg_schema),
            open=False,
            timeout=settings.pg_pool_timeout_s,  # a dead server is a prompt 503, not a 30 s wait
            kwargs={"autocommit": True, "connect_timeout": max(2, settings.pg_connect_timeout_s)},
        )
        await pool.open(wait=False)
        app.state.pg = pool
        app.state.es = AsyncElasticsearch(settings.es_url, request_timeout=settings.es_request_timeout_s)
        app.state.producer = None  # created on first publish (api.routes.events)
        try:
            yield
        finally:
            engine = getattr(app.state, "recall_engine", None)
            if engine is not None:  # its LISTEN connection (erasure notifications) goes with the app
                app.state.recall_engine = None
                await engine.aclose()
            if app.state.producer is not None:
                app.state.producer.close()
            await app.state.es.close()
            await pool.close()

    app = FastAPI(title="memory-ledger", version="0.1.0", lifespan=lifespan)
    app.state.settings = settings
    install_error_handlers(app)
    app.include_router(api_router, prefix="/v1")
    return app


app = create_app()
