"""The Compare tab: pick several jobs; their loss and eval-loss curves overlaid on one chart (and, for
preference jobs, their reward margin and accuracy on a second one), their configs side by side
with the differing keys marked, and their latest evaluations (the Evaluate tab's base-vs-tuned tables)
metric by metric, with a note naming the picked jobs that have none."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import gradio as gr

from studio import compare
from studio import jobs_view as view
from studio import plots, render, reward_view
from studio.context import StudioContext
from studio.i18n import t


@dataclass
class CompareTab:
    select: gr.Dropdown
    only_diff: gr.Checkbox
    outputs: list[Any]  # [select, plot, legend, config, rewards, evals, evals_note, shown]: what refresh() returns
    sync_colors: Callable[[Any], Any]  # sync_colors(event): the chart's colour sync after an event that redrew it

    def refresh(self, ctx: StudioContext, picked: list[str] | None, only_diff: bool = False,
                lang: str = "en") -> list[Any]:
        """The job list (the user's picks kept while their jobs exist), the view of them drawn afresh
        (their runs may have gone on) and that view's key."""
        records = ctx.runner.list_jobs()
        ids = {r.id for r in records}
        kept = [job_id for job_id in (picked or []) if job_id in ids]
        return [picks_update([view.job_choice(r, lang) for r in records], picked, kept),
                *view_outputs(ctx, kept, only_diff, lang), view_key(kept, only_diff, lang)]


def picks_update(choices: list[Any], picked: list[str] | None, kept: list[str]) -> Any:
    """The choices, and the picks only where a picked job is gone: a value written to the multiselect,
    even the list it holds, fires its `change`."""
    if kept == list(picked or []):
        return gr.update(choices=choices)
    return gr.update(choices=choices, value=kept)


def view_key(job_ids: list[str] | None, only_diff: bool, lang: str) -> tuple:
    """What the view below the picks depends on, apart from the runs' own progress (refresh redraws that)."""
    return tuple(job_ids or ()), bool(only_diff), lang


VIEW_OUTPUTS = 6  # view_outputs()'s length


def view_outputs(ctx: StudioContext, job_ids: list[str], only_diff: bool, lang: str) -> list[Any]:
    """[plot, legend, config, rewards, evals, evals_note] for the picked jobs."""
    return [*comparison(ctx, job_ids, only_diff, lang), reward_comparison(ctx, job_ids, lang),
            *evaluation_comparison(ctx, job_ids, lang)]


def on_view_change(ctx: StudioContext, job_ids: list[str] | None, only_diff: bool, lang: str,
                   shown: tuple | None) -> list[Any]:
    """The view for a pick, the "only differences" box or the language, and its key; nothing at all
    when the page already shows that view. Gradio 6.31's multiselect fires `change` again, with the
    picks it holds, whenever an update reaches the page, and `change` runs again once the running one
    is done (always_last): each redraw set off the next, about twice a second for as long as the tab
    stayed open. The chart flickered and a user's real pick queued behind the repeats."""
    key = view_key(job_ids, only_diff, lang)
    if shown == key:  # a gr.State hands back the very tuple it was given
        return [gr.skip()] * (VIEW_OUTPUTS + 1)
    return [*view_outputs(ctx, list(key[0]), only_diff, lang), key]


def comparison(ctx: StudioContext, job_ids: list[str] | None, only_diff: bool, lang: str) -> tuple[Any, str, str]:
    """(curves frame, its legend HTML, config table HTML) for the picked jobs, in the order picked."""
    records = [r for r in (ctx.runner.get(job_id) for job_id in job_ids or []) if r is not None]
    if not records:
        return compare.curves_frame([], lang), "", render.notice_html(t("compare.pick_hint", lang), "info")
    labels = [compare.run_label(r) for r in records]
    curves = compare.curves_frame([(label, ctx.events.get(r.job_dir)) for label, r in zip(labels, records)], lang)
    table = compare.config_table_html(labels, [r.spec or {} for r in records], only_diff, lang)
    return curves, compare.legend_html(curves), table


def reward_comparison(ctx: StudioContext, job_ids: list[str] | None, lang: str) -> Any:
    """The reward curves of the picked preference jobs overlaid; hidden when none has any."""
    records = [r for r in (ctx.runner.get(job_id) for job_id in job_ids or []) if r is not None]
    frame = reward_view.reward_curves_frame([(compare.run_label(r), ctx.events.get(r.job_dir)) for r in records],
                                            lang)
    return gr.update(value=frame, visible=not frame.empty)


def evaluation_comparison(ctx: StudioContext, job_ids: list[str] | None, lang: str) -> tuple[Any, str]:
    """(the picked jobs' latest evaluations as one table, hidden when none has any; the note naming
    those without one)."""
    records = [r for r in (ctx.runner.get(job_id) for job_id in job_ids or []) if r is not None]
    frame, missing = compare.evaluations_frame([(compare.run_label(r), r.job_dir) for r in records], lang)
    note = compare.evaluations_note(missing, lang)
    return gr.update(value=frame, visible=not frame.empty), render.notice_html(note, "info") if note else ""


def build_compare_tab(ctx: StudioContext) -> CompareTab:
    bind = ctx.page.bind
    bind(gr.Markdown(), value="compare.intro")
    with gr.Row():
        select = bind(gr.Dropdown(choices=[], value=[], multiselect=True, elem_id="ft-compare-select", scale=5),
                      label="compare.jobs")
        refresh_btn = bind(gr.Button(size="sm", scale=0, min_width=120, elem_id="ft-compare-refresh"),
                           value="compare.refresh")
    # colors_in_legend=[]: no vega legend (it cuts names at 160 px); the full names wrap below instead
    plot = bind(gr.LinePlot(x="step", y="loss", color="series", elem_id="ft-compare-plot", height=340,
                            colors_in_legend=[]),
                title="compare.plot_title", x_title="plot.step", y_title="plot.loss", color_title="plot.series")
    legend = gr.HTML(elem_id="ft-compare-legend")
    rewards = bind(gr.LinePlot(x="step", y="value", color="series", elem_id="ft-compare-reward-plot", height=300,
                               visible=False),
                   title="compare.reward_title", x_title="plot.step", y_title="plot.value", color_title="plot.series")
    only_diff = bind(gr.Checkbox(value=False, elem_id="ft-compare-only-diff"), label="compare.only_diff")
    config = gr.HTML(elem_id="ft-compare-config")
    evals = bind(gr.Dataframe(interactive=False, wrap=True, visible=False, elem_id="ft-compare-evals"),
                 label="compare.evals")
    evals_note = gr.HTML(elem_id="ft-compare-evals-note")
    shown = gr.State(None)  # view_key() of the view the page shows
    view_parts = [plot, legend, config, rewards, evals, evals_note]
    sent = gr.State(None)  # the chart's colour map as last sent (studio/plots.py)

    def on_sync(drawn: Any, previous: dict | None) -> list[Any]:
        return list(plots.color_sync(drawn, previous))

    def sync_colors(event: Any) -> Any:
        return event.then(on_sync, [plot, sent], [plot, sent], show_progress="hidden")

    tab = CompareTab(select=select, only_diff=only_diff, outputs=[select, *view_parts, shown],
                     sync_colors=sync_colors)

    def on_change(job_ids: list[str], only: bool, lang: str, key: tuple | None) -> list[Any]:
        return on_view_change(ctx, job_ids, only, lang, key)

    # one queue, in order, for everything that draws the view: a pick's answer still on its way when
    # "only differences" is ticked must not land after the tick's and show every row again (a loaded
    # 2-core machine, 2026-12-04)
    in_order = {"concurrency_id": "compare-view", "concurrency_limit": 1}
    for trigger in (select.change, only_diff.change, ctx.lang.change):
        sync_colors(trigger(on_change, [select, only_diff, ctx.lang, shown], [*view_parts, shown],
                            show_progress="hidden", **in_order))
    # the refresh leaves the picks as they are, so no change (and its colour sync) follows: it syncs itself
    sync_colors(refresh_btn.click(lambda picked, only, lang: tab.refresh(ctx, picked, only, lang),
                                  [select, only_diff, ctx.lang], tab.outputs, **in_order))
    return tab
