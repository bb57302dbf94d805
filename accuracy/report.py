"""The comparison's report: one JSON document, the terminal table (lines of text), and a PNG of
KL(A‖B) per position (matplotlib, Agg backend)."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .relative import RelativeResult
from .target import TargetInfo
from .tasks import AbsoluteResult

PNG_FLOOR = 1e-12  # KL values at or below this (an exact 0, rounding below 0) are drawn here


@dataclass(slots=True)
class Comparison:
    a: TargetInfo
    b: TargetInfo
    settings: dict
    relative: RelativeResult | None = None
    absolute: AbsoluteResult | None = None
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return {"a": asdict(self.a), "b": asdict(self.b), "settings": self.settings,
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "seconds": round(self.seconds, 3),
                "relative": self.relative.as_dict() if self.relative else None,
                "absolute": self.absolute.as_dict() if self.absolute else None}


def method_line(result: RelativeResult, vocab_size: int | None) -> str:
    if result.method == "exact":
        size = f" ({vocab_size} tokens)" if vocab_size else ""
        return f"KL(A‖B) is exact, over the whole vocabulary{size}."
    return (f"KL(A‖B) is estimated from the top-{result.top_k} log-probabilities of each side plus one bucket "
            "for the rest of the vocabulary: a lower bound of the full KL.")


def _g(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3g}"


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.2f} %"


def relative_lines(result: RelativeResult, vocab_size: int | None = None) -> list[str]:
    s = result.summary()
    lines = [f"Relative accuracy: A's greedy answers to {s['prompts']} prompts ({s['positions']} tokens), "
             "teacher-forced on B", f"  {method_line(result, vocab_size)}"]
    missing = s["positions"] - s["positions_compared"]
    if missing:
        lines.append(f"  {missing} of {s['positions']} positions not compared: B reported no distribution there, or "
                     "takes text and A's tokens do not survive re-tokenization")
    kl = s["kl"]
    if kl:
        lines += [f"  {'':22}{'mean':>10} {'± stderr':>10} {'median':>10} {'99 %':>10} {'max':>10}",
                  _kl_row("KL(A‖B)", kl)]
        if s.get("kl_topk"):
            lines.append(_kl_row(f"top-{result.top_k} estimate", s["kl_topk"]))
            err = s["topk_error"]
            lines.append(f"  {'':22}the estimate is {_g(err['mean_ratio'])}× the exact mean KL "
                         f"(mean |error| {_g(err['mean_abs'])}, max {_g(err['max_abs'])})")
    lines.append(f"  {'same top token':22}{_pct(s['same_top'])} ± {_pct(s['same_top_stderr'])} of positions")
    dp = s["delta_p"]
    label = "Δp of A's token"
    lines.append(f"  {label:22}mean {_g(dp['mean'])}, RMS {_g(dp['rms'])}, max |Δp| {_g(dp['max_abs'])}")
    lines.append(f"  {'first divergence':22}{s['prompts_diverged']} of {s['prompts']} answers; "
                 "B's greedy answer equals A's up to it")
    lines += ["", f"  {'#':>3} {'tokens':>6} {'agree':>8} {'mean KL':>10} {'max KL':>10}  first divergence "
                  "(position: A's token → B's token, KL there)"]
    lines += [_prompt_row(i, r) for i, r in enumerate(result.prompts, 1)]
    return lines


def _kl_row(label: str, kl: dict) -> str:
    return (f"  {label:22}{_g(kl['mean']):>10} {_g(kl['stderr']):>10} {_g(kl['median']):>10} "
            f"{_g(kl['percentiles']['99.0']):>10} {_g(kl['max']):>10}")


def _prompt_row(i: int, r) -> str:
    known = [p for p in r.positions if p.agree is not None]
    kls = [p.kl for p in r.positions if p.kl is not None]
    agree = sum(bool(p.agree) for p in known) / len(known) if known else math.nan
    first = r.first_divergence
    where = "none" if first is None else f"{first.index}: {first.token!r} → {first.b_token!r}, KL {_g(first.kl)}"
    mean = sum(kls) / len(kls) if kls else None
    return (f"  {i:>3} {len(r.positions):>6} {_pct(agree):>8} {_g(mean):>10} {_g(max(kls) if kls else None):>10}  "
            f"{where}")


def absolute_lines(result: AbsoluteResult) -> list[str]:
    s = result.summary()
    lines = [f"Absolute accuracy: task {s['task']} ({s['items']} items, exact match)",
             f"  {'':4}{'correct':>8} {'accuracy':>10}   95 % CI (Wilson)"]
    for side in ("a", "b"):
        x = s[side]
        low, high = x["ci95"]
        lines.append(f"  {side.upper():4}{x['correct']:>8} {_pct(x['accuracy']):>10}   "
                     f"[{100 * low:.1f} %, {100 * high:.1f} %]")
    lines.append(f"  flips: {s['flips']} items (right on A only: {s['only_a']}, on B only: {s['only_b']}); "
                 f"McNemar exact p = {s['mcnemar_p']:.3g}")
    return lines


def header_lines(comparison: Comparison) -> list[str]:
    return [f"A: {_describe(comparison.a)}", f"B: {_describe(comparison.b)}"]


def _describe(info: TargetInfo) -> str:
    details = ", ".join(f"{k} {v}" for k, v in info.details.items())
    return f"{info.spec}  ({details})" if details else info.spec


def write_png(result: RelativeResult, path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for i, r in enumerate(result.prompts, 1):
        xs = [p.index for p in r.positions if p.kl is not None]
        ys = [max(p.kl, PNG_FLOOR) for p in r.positions if p.kl is not None]
        line, = ax.plot(xs, ys, lw=1, alpha=0.7, label=f"prompt {i}")
        first = r.first_divergence
        if first is not None and first.kl is not None:
            ax.plot([first.index], [max(first.kl, PNG_FLOOR)], "x", ms=9, mew=2, color=line.get_color())
    ax.set_yscale("log")
    ax.set_xlabel("position in A's answer (token)")
    ax.set_ylabel("KL(A‖B) (nats)")
    ax.set_title(f"{title}\n{method_line(result, None)}  × = first divergence", fontsize=9)
    if len(result.prompts) <= 10:
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
