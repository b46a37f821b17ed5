"""One PNG per suite: TFLOP/s against sequence length, a line per implementation.

Panels split the rows by direction (rows of the grid) and by head dim, heads, mask and dtype
(columns), so each panel compares implementations on one problem family; the GEMM ceiling of the
panel's dtype, measured in the same run, is drawn as a dashed line. Flashrung kernels are drawn
solid and thick, peers thin. Where rows carry a speed target (``targets``), a last row of panels
draws the product's paired ratio over the best peer (median, p10–p90) against the target line,
filled where met, and the target row's rate target sits as a bar on its TFLOP/s panel. Needs
matplotlib (``pip install flashrung[plot]``); it is imported here only, with the non-interactive
Agg backend.
"""
from __future__ import annotations

import pathlib

from flashrung import jsonfile
from flashrung.bench import numerators, peers, report, targets


class PlotUnavailable(RuntimeError):
    pass


def pyplot(replot_command: str):
    """``matplotlib.pyplot`` on the non-interactive Agg backend; without matplotlib,
    :class:`PlotUnavailable` saying how to re-plot later (``flashrung <replot_command> --from-json``)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailable(f"matplotlib is not installed ({exc}); pip install matplotlib, or re-plot later "
                              f"with `flashrung {replot_command} --from-json RESULTS.json --plot OUT.png`") from None
    return plt


def save(fig, path) -> pathlib.Path:
    """Write ``fig`` as a PNG at ``path`` (parents created) and release it."""
    import matplotlib.pyplot as plt
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_for_cli(render, doc: dict, plot_path, json_path) -> None:
    """The CLIs' plot step: ``render(doc, target)`` at ``--plot``, else beside a ``--json`` file
    (same stem); reports the file written, or why there is none, on stderr."""
    import sys
    target = plot_path
    if target is None and json_path and json_path != "-":
        target = jsonfile.sibling(json_path, ".png")
    if target is None:
        return
    try:
        print(f"wrote {render(doc, target)}", file=sys.stderr)
    except PlotUnavailable as exc:
        print(f"no plot: {exc}", file=sys.stderr)


def _facet(row: dict) -> tuple:
    window = tuple(row["window"]) if row.get("window") is not None else None
    return (row["headdim"], row["heads_q"], row["heads_kv"], row["causal"], row["dtype"], window)


def _facet_title(f: tuple) -> str:
    d, hq, hkv, causal, dtype, window = f
    h = f"H{hq}" if hq == hkv else f"H{hq}/{hkv}"
    win = f" window {window[0]},{window[1]}" if window is not None else ""
    return f"d{d} {h} {'causal' if causal else 'non-causal'}{win} {dtype}"


def plot(doc: dict, path: str | pathlib.Path) -> pathlib.Path:
    plt = pyplot("bench")
    rows = doc["rows"]
    modes = [m for m in ("fwd", "bwd") if any(r["mode"] == m for r in rows)]
    facets = sorted({_facet(r) for r in rows}, key=lambda f: (-f[0], f[3], f[4], f[5] or (-2, -2)))
    if not rows:
        raise ValueError("no rows to plot")
    impls = doc["impls"]
    held = [i for i in report.target_impls(impls) if any(targets.reading(r, i) for r in rows)]
    ncols, nrows = len(facets), len(modes)
    fig, axes = plt.subplots(nrows + bool(held), ncols, figsize=(4.2 * ncols, 3.6 * nrows + 3.0 * bool(held)),
                             squeeze=False, sharey="row")
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    conv = numerators.LABELS[doc.get("causal_convention", numerators.FA_HALF)]
    for i, mode in enumerate(modes):
        for j, facet in enumerate(facets):
            ax = axes[i][j]
            sel = sorted((r for r in rows if r["mode"] == mode and _facet(r) == facet), key=lambda r: r["seqlen_q"])
            for k, impl in enumerate(impls):
                pts = [(r["seqlen_q"], r["results"][impl]["tflops"]) for r in sel
                       if r["results"].get(impl, {}).get("status") == "ok"]
                if not pts:
                    continue
                xs, ys = zip(*pts)
                ours = peers.is_ours(impl)
                ax.plot(xs, ys, marker="o", ms=4 if ours else 3, lw=2.4 if ours else 1.2,
                        color=colors[k % len(colors)], label=impl, zorder=3 if ours else 2)
            for r in sel:
                target = targets.target_for(r)
                if target is not None and target.min_tflops is not None:
                    ax.plot([r["seqlen_q"]], [target.min_tflops], marker="_", ms=16, mew=2, color="k", ls="none",
                            label="rate target", zorder=4)
            gemm = doc.get("ceilings", {}).get(f"gemm:{facet[4]}")
            if gemm:
                ax.axhline(gemm["value"], ls="--", color="0.4", lw=1, label=f"GEMM ceiling {gemm['value']:.0f}")
            ax.set_xscale("log", base=2)
            ax.set_ylim(bottom=0)
            if sel:
                ax.set_xticks([r["seqlen_q"] for r in sel])
                ax.set_xticklabels([f"{r['seqlen_q'] // 1024}k" if r["seqlen_q"] >= 1024 else str(r["seqlen_q"])
                                    for r in sel])
            ax.set_title(f"{mode} · {_facet_title(facet)}", fontsize=9)
            ax.grid(True, alpha=0.3)
            if j == 0:
                ax.set_ylabel("TFLOP/s")
            if i == nrows - 1:
                ax.set_xlabel("sequence length")
    if held:
        for j, facet in enumerate(facets):
            _target_panel(axes[nrows][j], [r for r in rows if _facet(r) == facet], held, impls, colors,
                          first_column=j == 0)
    handles, labels = {}, {}
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            key = "GEMM" if lab.startswith("GEMM") else lab   # one ceiling entry whatever its value
            handles.setdefault(key, h)
            labels.setdefault(key, "GEMM ceiling (same run)" if key == "GEMM" else lab)
    fig.legend(list(handles.values()), list(labels.values()), loc="lower center", ncol=min(8, len(handles)),
               fontsize=8, frameon=False)
    gpu = doc.get("manifest", {}).get("environment", {}).get("gpu") or "?"
    fig.suptitle(f"flashrung bench — suite {doc.get('suite', '?')} on {gpu}; {conv}; backward = 2.5 × forward",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    return save(fig, path)


def _target_panel(ax, rows: list, held: list, impls: list, colors: list, first_column: bool) -> None:
    """Each held implementation's paired ratio over the row's target peer against the target."""
    sel = sorted((r for r in rows if targets.target_for(r) is not None), key=lambda r: r["seqlen_q"])
    for impl in held:
        pts = [(r["seqlen_q"], rd) for r in sel if (rd := targets.reading(r, impl)).ratio is not None]
        if not pts:
            continue
        color = colors[impls.index(impl) % len(colors)]
        xs = [x for x, _ in pts]
        ys = [rd.ratio for _, rd in pts]
        err = [[rd.ratio - rd.lo for _, rd in pts], [rd.hi - rd.ratio for _, rd in pts]]
        ax.errorbar(xs, ys, yerr=err, color=color, lw=2, capsize=3, marker="none", label=f"{impl} ÷ peer (paired)")
        for x, rd in pts:
            ax.plot([x], [rd.ratio], marker="o", ms=6, color=color, mfc=color if rd.met else "white", ls="none",
                    zorder=3)
    ax.set_xscale("log", base=2)
    if sel:
        xs = [r["seqlen_q"] for r in sel]
        ax.plot(xs, [targets.target_for(r).min_ratio for r in sel], ls=":", color="k", lw=1.5,
                drawstyle="steps-mid", label="target (filled: met)")
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{x // 1024}k" if x >= 1024 else str(x) for x in xs])
    ax.axhline(1.0, color="0.6", lw=0.8)
    ax.set_title("fwd · against the target", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.set_xlabel("sequence length")
    if first_column:
        ax.set_ylabel("÷ best peer (paired)")
