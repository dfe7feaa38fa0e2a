"""The Jobs tab's Ray cluster panel: the cluster's nodes (alive or dead; CPUs, GPUs and memory, free of
all) and its jobs, read from its dashboard (jobs/queue/cluster_resources.py: Ray's REST endpoints, no
Ray needed here), and where a job's files are.

Which cluster: the address typed in the panel; it starts with the studio's own (`--cluster` /
FUSETUNE_CLUSTER, app.py), else the `cluster` key of the newest job that has one. It is read when
the panel opens, on Refresh and every CLUSTER_POLL_S while the Jobs tab is open (one reading per
address is shared for a few seconds by every page and the queue). An unreachable cluster is one
sentence naming the address and why, never a traceback. (The Ray dashboard's own Cluster and Jobs
pages show the same; LlamaBoard and ms-swift's web UI show no cluster at all.)"""
from __future__ import annotations

import html
import time
from pathlib import Path
from typing import Any

import gradio as gr

from jobs.io import paths
from jobs.queue.cluster_resources import Amount, ClusterUnreachable, ClusterView
from studio import render
from studio.context import StudioContext
from studio.i18n import t
from studio.server_text import translated

CLUSTER_POLL_S = 5.0
TABLE_STYLE = "border-collapse:collapse;font-size:13px;margin:6px 0 10px;width:100%"
CELL_STYLE = "padding:3px 8px;border-bottom:1px solid rgba(128,128,128,.25);text-align:left;vertical-align:top"


def default_address(ctx: StudioContext) -> str:
    """The studio's cluster, else the newest job's (the runner lists newest first)."""
    if ctx.cluster:
        return ctx.cluster
    for record in ctx.runner.list_jobs():
        address = str((record.spec or {}).get("cluster") or "").strip()
        if address:
            return address
    return ""


def panel_html(ctx: StudioContext, address: str | None, lang: str, fresh: bool = False) -> str:
    """The panel for the cluster at `address`: a summary, its nodes, its jobs, where files are.
    `fresh`: not the reading shared for a few seconds (Refresh)."""
    address = (address or "").strip()
    if not address:
        return render.notice_html(t("cluster.none", lang), "info")
    if fresh and hasattr(ctx.cluster_reader, "forget"):
        ctx.cluster_reader.forget(address)
    try:
        view = ctx.cluster_reader.read(address)
    except ClusterUnreachable as exc:
        return render.notice_html(translated(str(exc), lang), "error")
    return (_summary(view, lang) + _nodes_table(view, lang) + _jobs_table(ctx, view, lang)
            + _files_line(ctx, lang))


def files_html(record: Any, lang: str) -> str:
    """For a job that trains beyond this machine: where its files are, and who writes them; else ""."""
    spec = record.spec or {}
    folder = html.escape(str(record.job_dir))
    if spec.get("cluster"):
        text = t("cluster.job_files", lang, cluster=spec["cluster"])
    elif int(spec.get("nodes", 1) or 1) > 1:
        text = t("cluster.node_files", lang, rank=spec.get("node_rank", 0), nodes=spec["nodes"],
                 endpoint=spec.get("rdzv_endpoint", ""))
    else:
        return ""
    return f'<div class="ft-job-files">{html.escape(text)} <code>{folder}</code></div>'


def _summary(view: ClusterView, lang: str) -> str:
    alive = sum(1 for node in view.nodes if node.alive)
    text = t("cluster.summary", lang, address=view.address, alive=alive, nodes=len(view.nodes),
             gpus=_free_of(view.free("gpus"), view.total("gpus")), cpus=_free_of(view.free("cpus"), view.total("cpus")))
    return f'<div class="ft-cluster-summary" style="font-size:14px;margin:4px 0">{html.escape(text)}</div>'


def _nodes_table(view: ClusterView, lang: str) -> str:
    rows = []
    for node in view.nodes:
        name = node.name + (f" ({node.ip})" if node.ip and node.ip != node.name else "")
        name += t("cluster.head", lang) if node.head else ""
        state = t("cluster.alive", lang) if node.alive else t("cluster.dead", lang, why=node.why_dead or "?")
        rows.append([name, state, _amount(node.cpus), _amount(node.gpus), _amount(node.memory_gb, " GiB")])
    headers = [t("cluster.col_node", lang), t("cluster.col_state", lang), t("cluster.col_cpus", lang),
               t("cluster.col_gpus", lang), t("cluster.col_memory", lang)]
    return _table("ft-cluster-nodes", headers, rows)


def _jobs_table(ctx: StudioContext, view: ClusterView, lang: str) -> str:
    if not view.jobs:
        return f'<div class="ft-cluster-jobs">{html.escape(t("cluster.no_jobs", lang))}</div>'
    ours = {str(Path(r.job_dir)): r for r in ctx.runner.list_jobs()}
    rows = []
    for job in view.jobs:
        record = ours.get(str(Path(job.job_folder))) if job.job_folder else None
        name = f"{record.name} ({record.id})" if record is not None else "—"
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(job.started_at)) if job.started_at else ""
        rows.append([job.submission_id, job.status, started, name, job.job_folder or job.entrypoint])
    headers = [t("cluster.col_ray_job", lang), t("cluster.col_status", lang), t("cluster.col_started", lang),
               t("cluster.col_job", lang), t("cluster.col_files", lang)]
    return _table("ft-cluster-jobs", headers, rows)


def _files_line(ctx: StudioContext, lang: str) -> str:
    text = t("cluster.files", lang)
    folder = html.escape(str(paths.jobs_dir(ctx.data_dir)))
    return f'<div class="ft-cluster-files" style="font-size:13px">{html.escape(text)} <code>{folder}</code></div>'


def _table(elem_id: str, headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f'<th style="{CELL_STYLE}">{html.escape(h)}</th>' for h in headers)
    body = "".join("<tr>" + "".join(f'<td style="{CELL_STYLE}">{html.escape(str(c))}</td>' for c in row) + "</tr>"
                   for row in rows)
    return f'<table id="{elem_id}" style="{TABLE_STYLE}"><tr>{head}</tr>{body}</table>'


def _amount(amount: Amount, unit: str = "") -> str:
    return _free_of(amount.free, amount.total) + unit


def _free_of(free: float | None, total: float) -> str:
    """"1 / 3" (free of all), "? / 3" when the cluster did not say what is free."""
    return f"{'?' if free is None else _number(free)} / {_number(total)}"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.1f}"


def build_cluster_panel(ctx: StudioContext) -> None:
    """The panel, closed unless the studio was started with a cluster; wired to read when it opens."""
    bind = ctx.page.bind
    with bind(gr.Accordion(open=bool(ctx.cluster), elem_id="ft-cluster"), label="cluster.title") as panel:
        with gr.Row():
            address = bind(gr.Textbox(value=lambda: default_address(ctx), placeholder="http://head-node:8265",
                                      elem_id="ft-cluster-address", scale=4), label="cluster.address")
            refresh = bind(gr.Button(elem_id="ft-cluster-refresh", scale=1, min_width=140), value="cluster.refresh")
        shown = gr.HTML(elem_id="ft-cluster-view")
    timer = gr.Timer(CLUSTER_POLL_S, active=bool(ctx.cluster))

    def show(where: str | None, language: str) -> str:
        return panel_html(ctx, where, language, fresh=True)

    def follow(where: str | None, language: str) -> Any:   # the poll: only a panel that shows a cluster
        return panel_html(ctx, where, language) if (where or "").strip() else gr.skip()

    quiet = {"show_progress": "hidden"}
    refresh.click(show, [address, ctx.lang], shown, api_name="cluster_view")
    address.submit(show, [address, ctx.lang], shown)
    panel.expand(show, [address, ctx.lang], shown, **quiet)
    panel.expand(lambda: gr.Timer(active=True), None, timer, **quiet)
    panel.collapse(lambda: gr.Timer(active=False), None, timer, **quiet)
    timer.tick(follow, [address, ctx.lang], shown, **quiet)
