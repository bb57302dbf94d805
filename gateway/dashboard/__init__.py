"""The live dashboard of ``infer serve``: the page at ``/dashboard`` (``page.py``, static files in
``static/``) and the JSON it polls besides ``/infer/routes`` and ``/infer/cost`` (``api.py``:
``/infer/requests``, ``/infer/series``, ``/infer/keys``, ``/infer/dashboard``)."""

from fastapi import APIRouter

from gateway.dashboard import api, page

router = APIRouter()
router.include_router(api.router)
router.include_router(page.router)

__all__ = ["router"]
