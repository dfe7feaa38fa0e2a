"""The Jobs tab's Ray cluster panel in a real browser, against a stand-in dashboard that answers with recorded
Ray 2.60 JSON (tests/jobs/fake_ray.py): the studio's own process reads it over HTTP, the page lists the
nodes (one dead, free of all) and the cluster's job with its folder. No Ray anywhere (the Chinese panel:
tests/studio/test_cluster_view.py)."""
from __future__ import annotations

from tests.e2e.studio_page import open_studio, set_text
from tests.jobs.fake_ray import dashboard


def panel_says(page, text: str) -> None:
    page.wait_for_function("(w) => (document.querySelector('#ft-cluster-view') || {innerText: ''}).innerText"
                           ".includes(w)", arg=text, timeout=60_000)


def test_the_jobs_tab_lists_a_ray_clusters_nodes_and_jobs(studio, browser_context):
    url, _, data_dir = studio
    with dashboard() as (address, asked):
        page = open_studio(browser_context, url)
        page.get_by_role("tab", name="Jobs").click()
        page.locator("#ft-cluster").get_by_text("Ray cluster", exact=True).first.click()   # open the panel
        panel_says(page, "No Ray cluster to show")   # no --cluster, no cluster job yet: it says how to name one
        set_text(page, "ft-cluster-address", address)
        page.locator("#ft-cluster-refresh").click()
        panel_says(page, f"{address}: 2 of 3 nodes alive · GPUs free 1 / 3 · CPUs free 1 / 3")
        text = page.locator("#ft-cluster-view").inner_text()
        assert "dead: Unexpected termination: health check failed" in text
        assert "fusetune-20261204-demo-a1b2c3" in text and "/shared/fusetune/jobs/20261204-demo" in text
        assert str(data_dir / "jobs") in text and "/api/cluster_status" in asked
    page.close()
