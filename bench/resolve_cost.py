"""What resolving a request's model and options costs, per request, in the tree on ``PYTHONPATH`` (issue 41):
the store lookup (``model_details``: the name resolved, the cached details checked against the manifest) plus
``resolve_options``, which a native runner did for every request before it took the gateway's ``Resolved``,
against building the options from what the gateway sent (``Options.model_construct``). A store with the two
tiny models (``fakes/models.py``); best of 5 repeats of 2,000 calls.

    PYTHONPATH=. .venv/bin/python bench/resolve_cost.py
    PYTHONPATH=/tmp/base .venv/bin/python bench/resolve_cost.py   # an older tree (git archive <commit>)
"""

import tempfile
import timeit
from pathlib import Path

from adapters.engines.store_models import model_details
from core.options import Options, resolve_options
from core.settings import DEFAULTS
from fakes.models import install_tiny_models

CALLS = 2000


def main() -> None:
    store = install_tiny_models(Path(tempfile.mkdtemp(prefix="resolve-cost-")))
    details = model_details(store, "tiny")
    sent = resolve_options(details.parameters, {"temperature": 0}, defaults=DEFAULTS.option_defaults).model_dump()

    def from_the_store() -> None:
        found = model_details(store, "tiny")
        resolve_options(found.parameters, {"temperature": 0, "num_predict": 8}, defaults=DEFAULTS.option_defaults)

    def lookup_only() -> None:
        model_details(store, "tiny")

    def as_sent() -> None:
        Options.model_construct(**sent)

    for fn in (from_the_store, lookup_only, as_sent):
        best = min(timeit.repeat(fn, number=CALLS, repeat=5)) / CALLS
        print(f"{fn.__name__:16s} {best * 1e6:7.1f} us per request")


if __name__ == "__main__":
    main()
