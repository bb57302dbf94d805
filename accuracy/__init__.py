"""Accuracy of one deployment against another (`infer compare`).

Relative accuracy: KL divergence between the two next-token distributions along A's greedy answers
(``relative``, ``divergence``). Absolute accuracy: exact-match tasks with confidence intervals
(``tasks``). Targets are in-process engines or servers behind one protocol (``target``,
``targets``, ``engines``, ``remote``); ``report`` renders the result.
"""

from __future__ import annotations

from .compare import run_compare
from .divergence import kl_buckets, kl_rows, summarize
from .relative import RelativeResult, compare_relative
from .report import Comparison
from .target import Continuation, Dist, Piece, Target, TargetError, Vocab
from .targets import open_target
from .tasks import AbsoluteResult, compare_absolute, load_task, wilson

__all__ = [
    "AbsoluteResult",
    "Comparison",
    "Continuation",
    "Dist",
    "Piece",
    "RelativeResult",
    "Target",
    "TargetError",
    "Vocab",
    "compare_absolute",
    "compare_relative",
    "kl_buckets",
    "kl_rows",
    "load_task",
    "open_target",
    "run_compare",
    "summarize",
    "wilson",
]
