"""The Jobs tab's Ray cluster panel (studio/cluster_view.py) against a stand-in dashboard answering with recorded
Ray 2.60 JSON (tests/jobs/fake_ray.py): nodes alive and dead with free of all, the cluster's jobs named by our
job folders, where files are, and an unreachable cluster said in one sentence in either language."""
from types import SimpleNamespace

from jobs.queue.cluster_resources import DashboardReader
from jobs.queue.store import JobRecord
from studio.cluster_view import default_address, files_html, panel_html
from studio.context import StudioContext
from tests.jobs.fake_ray import dashboard
from tests.studio.fakes import ListRunner

OURS = JobRecord(id="20261204-demo", name="tiny on the cluster", state="running", created_at=0.0,
                 job_dir="/shared/fusetune/jobs/20261204-demo", spec={"cluster": "http://head:8265"})


def context(tmp_path, records=(), cluster=""):
    return StudioContext(data_dir=tmp_path, runner=ListRunner(list(records)), chat=SimpleNamespace(),
                         cluster=cluster, cluster_reader=DashboardReader())


def test_the_panel_lists_nodes_free_of_all_and_the_clusters_jobs_by_our_names(tmp_path):
    ctx = context(tmp_path, [OURS])
    with dashboard() as (address, _):
        shown = panel_html(ctx, address, "en")
    assert f"{address}: 2 of 3 nodes alive · GPUs free 1 / 3 · CPUs free 1 / 3" in shown
    nodes = shown.split('id="ft-cluster-nodes"')[1].split("</table>")[0]
    rows = nodes.split("<tr>")[2:]
    assert "127.0.0.1 · head" in rows[0] and ">alive<" in rows[0] and ">1 / 2<" in rows[0]
    assert ">0 / 1<" in rows[1]   # the worker's one GPU is taken
    assert "dead: Unexpected termination: health check failed" in rows[2] and ">? / 1<" in rows[2]
    jobs = shown.split('id="ft-cluster-jobs"')[1]
    assert "fusetune-20261204-demo-a1b2c3" in jobs and "RUNNING" in jobs
    assert "tiny on the cluster (20261204-demo)" in jobs and "/shared/fusetune/jobs/20261204-demo" in jobs
    assert f"<code>{tmp_path / 'jobs'}</code>" in shown and "shared storage" in shown


def test_the_panel_speaks_chinese_and_names_an_unreachable_cluster(tmp_path):
    ctx = context(tmp_path)
    with dashboard() as (address, _):
        assert "3 个节点中 2 个在线" in panel_html(ctx, address, "zh-CN")
    down = panel_html(ctx, address, "en")   # the server is gone: nothing listens there
    assert f"cannot reach the Ray cluster at {address} (" in down and "ray start --head" in down
    assert "Traceback" not in down and "ft-error" in down
    assert f"无法连接位于 {address} 的 Ray 集群" in panel_html(ctx, address, "zh-CN")
    assert "--cluster ADDRESS" in panel_html(ctx, "  ", "en")


def test_a_cluster_that_demands_a_token_says_what_to_set_and_shows_once_it_is_set(tmp_path, monkeypatch):
    """A dashboard under Ray's token auth answers the panel 401: one sentence naming the setting, in either
    language; with FUSETUNE_CLUSTER_TOKEN set (the studio's environment) the same panel shows the cluster."""
    for name in ("FUSETUNE_CLUSTER_TOKEN", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    ctx = context(tmp_path, [OURS])
    with dashboard(token="s3cret-token") as (address, _):
        refused = panel_html(ctx, address, "en", fresh=True)
        assert f"the Ray cluster at {address} needs a token (HTTP 401 Unauthorized): set FUSETUNE_CLUSTER_TOKEN" \
            in refused and "ft-error" in refused and "Traceback" not in refused
        assert f"位于 {address} 的 Ray 集群需要令牌" in panel_html(ctx, address, "zh-CN", fresh=True)
        monkeypatch.setenv("FUSETUNE_CLUSTER_TOKEN", "s3cret-token")
        shown = panel_html(ctx, address, "en", fresh=True)
    assert f"{address}: 2 of 3 nodes alive" in shown and "s3cret-token" not in shown + refused


def test_the_shown_cluster_is_the_studios_else_the_newest_cluster_jobs(tmp_path):
    assert default_address(context(tmp_path, [OURS], cluster="http://studio:8265")) == "http://studio:8265"
    assert default_address(context(tmp_path, [OURS])) == "http://head:8265"
    assert default_address(context(tmp_path)) == ""


def test_a_job_beyond_this_machine_says_where_its_files_are(tmp_path):
    assert "on the shared storage" in files_html(OURS, "en") and OURS.job_dir in files_html(OURS, "en")
    node = JobRecord(id="n", name="n", state="running", created_at=0.0, job_dir="/data/jobs/n",
                     spec={"nodes": 2, "node_rank": 1, "rdzv_endpoint": "10.0.0.1:29500"})
    assert "Node 1 of 2 (rendezvous 10.0.0.1:29500): node 0 writes" in files_html(node, "en")
    assert "共享存储" in files_html(OURS, "zh-CN")
    local = JobRecord(id="l", name="l", state="running", created_at=0.0, job_dir="/data/jobs/l", spec={})
    assert files_html(local, "en") == ""
