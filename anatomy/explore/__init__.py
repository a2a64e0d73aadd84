"""`anatomy explore`: a live local page where every step of a model updates as you type.

    anatomy explore --model smollm2 --model toy          # prints http://127.0.0.1:PORT/?token=...
    uvicorn anatomy.explore:app                          # the same app, configured by environment

The floor's files: models (the models it may open, loaded on first use, with their SAEs and
transcoders), state (the traced passes, one per text, cached within a memory budget; a decoder's pass
continues the last text's, analysis/prefix.py), values (a request's settings checked, the numbers of a
reply), panels (each panel's JSON, drawn from the floors below: walk, viz, generation), analyses
(attribution, interventions, head scores), lens, features and compare (those panels), exports (a
panel's JSON, page or PNG), lanes (where requests wait: a quick and a slow lane per model, the newest
first), jobs (patching, integrated gradients and head scores off the request path, with progress,
cancelling and bounds), guard (the checks of a local server: token, Host, Origin, sizes, the JSON a
body may hold), connections (the deadlines and the bound on connections uvicorn lacks), assets (the
page, its files and their policies), routes and job_routes (one handler per route of docs/explore.md),
server (the ASGI application: the table of routes), cli (the command), static/ (the page: one script
per panel).
"""

__all__ = ["app", "create_app"]


def __getattr__(name):
    # Imported on first use, so that `anatomy explore`'s arguments are checked before torch loads;
    # `uvicorn anatomy.explore:app` builds the app from the environment, only when asked for.
    if name == "create_app":
        from .server import create_app

        return create_app
    if name == "app":
        from .server import app_from_environment

        return app_from_environment()
    raise AttributeError(f"module 'anatomy.explore' has no attribute {name!r}")
