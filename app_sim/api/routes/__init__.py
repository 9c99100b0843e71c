"""The app API's routes, one module per resource, each with an ``APIRouter`` named ``router``.

:data:`ROUTERS` is the order ``create_app`` includes them in, which is the order of the paths in
the OpenAPI document. Within it, ``DELETE /v1/users/me`` (erasure) precedes
``DELETE /v1/users/{user_id}``, so ``me`` is never read as an id.
"""

from app_sim.api.routes import erasure, follows, messages, ops, posts, reads, status, users

# /metrics (outside the OpenAPI document), the writes (users, follows, posts, messages, status,
# erasure), the reads, /v1/health
ROUTERS = (
    ops.metrics_router,
    users.router,
    follows.router,
    posts.router,
    messages.router,
    status.router,
    erasure.router,
    reads.router,
    ops.router,
)
