"""The token sent to a Ray dashboard with token authentication (jobs/io/cluster_auth.py): the operator's
FUSETUNE_CLUSTER_TOKEN first, then Ray's own in Ray's order (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH's file,
~/.ray/auth_token) only under RAY_AUTH_MODE=token, as Ray's own clients send it; to the studio's own
cluster only when it has one. Reading it: tests/jobs/queue/
test_cluster_queue.py, tests/studio/test_cluster_view.py; the Jobs API: tests/jobs/train/test_cluster_submit.py."""
from jobs.io.cluster_auth import auth_headers, cluster_token, goes_to, token_refusal, token_source

HEAD = "http://head:8265"


def test_the_operators_token_comes_first_and_rays_only_under_its_token_mode(tmp_path):
    ray_file = tmp_path / "home" / ".ray" / "auth_token"
    ray_file.parent.mkdir(parents=True)
    ray_file.write_text("from-ray-file\n")
    home = {"HOME": str(tmp_path / "home")}
    assert auth_headers(HEAD, {**home, "FUSETUNE_CLUSTER_TOKEN": " ours ", "RAY_AUTH_MODE": "token",
                               "RAY_AUTH_TOKEN": "rays"}) == {"Authorization": "Bearer ours"}
    # a local ray.init writes ~/.ray/auth_token: not sent to a cluster unless Ray's token mode is on here
    assert cluster_token({**home, "RAY_AUTH_TOKEN": "rays"}) is None and auth_headers(HEAD, home) == {}
    assert cluster_token({**home, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "rays"}).value == "rays"
    assert cluster_token({**home, "RAY_AUTH_MODE": "token"}).value == "from-ray-file"
    assert token_source({**home, "RAY_AUTH_MODE": "token"}) == str(ray_file)
    named = tmp_path / "token.txt"
    named.write_text("named")
    assert cluster_token({**home, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(named)}).value == "named"
    assert cluster_token({"HOME": str(tmp_path / "nobody"), "RAY_AUTH_MODE": "token"}) is None
    assert token_source({"FUSETUNE_CLUSTER_TOKEN": "x"}) == "FUSETUNE_CLUSTER_TOKEN" and token_source({}) == ""


def test_a_studio_with_its_own_cluster_sends_the_token_there_only_and_says_so_elsewhere():
    """FUSETUNE_CLUSTER (app.py --cluster): the token goes to that dashboard (any path, the same scheme, host
    and port), not to an address a page user typed; a 401 from such an address names the studio's cluster."""
    env = {"FUSETUNE_CLUSTER": "http://Head:8265/", "FUSETUNE_CLUSTER_TOKEN": "ours"}
    assert auth_headers("http://head:8265/api/jobs/", env) == {"Authorization": "Bearer ours"}
    assert auth_headers("http://head:8266", env) == auth_headers("http://evil:8265", env) == {}
    assert goes_to("https://evil/", {}) and goes_to("http://head/", {"FUSETUNE_CLUSTER": "http://head:80"})
    said = token_refusal("http://other:8265", "HTTP 401 Unauthorized", env)
    assert said == ("the Ray cluster at http://other:8265 needs a token (HTTP 401 Unauthorized), and this studio "
                    "sends its token only to its own cluster, http://Head:8265/: start the studio with this address "
                    "as --cluster (or FUSETUNE_CLUSTER) to use it") and "ours" not in said
    assert "refused the token from FUSETUNE_CLUSTER_TOKEN" in token_refusal(HEAD + "/", "HTTP 403 Forbidden",
                                                                              {**env, "FUSETUNE_CLUSTER": HEAD})
    assert "needs a token (HTTP 401 Unauthorized): set FUSETUNE_CLUSTER_TOKEN" in token_refusal(HEAD, "HTTP 401 Unauthorized", {})
