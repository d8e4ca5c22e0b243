"""benchmarks/run_gpu.sh and what it runs (benchmarks/gpu_run/), on a CPU: the dry run (every
stage's command would start), the stage runner's limits, the test grid's selection, the
summary built from result files, and the benchmark scripts it adds on tiny inputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks import corpus_tokens, random_folder
from benchmarks.gpu_run import dry_run, grid, install, plan, runner, samples, summary, wheels
from fastbert.bench.shapes import MODEL_SHAPES

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_dry_run_would_start_every_stage(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.run(
        ["bash", "benchmarks/run_gpu.sh", "--dry-run", str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = [s.name for s in plan.stages(tmp_path, tmp_path, sys.executable)]
    for name in names:
        assert f"{name:<20}would start" in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu-run.tar.gz", "summary.txt"]
    with tarfile.open(tmp_path / "gpu-run.tar.gz") as archive:
        members = set(archive.getnames())
    assert {"gpu-run/summary.txt", "gpu-run/stages.json", "gpu-run/bench/results.json"} <= members
    text = (tmp_path / "summary.txt").read_text()
    assert len(text.splitlines()) <= 40
    assert all(f"\n{name:<20}ok" in text for name in names)


def _stage(name: str, *command: str, cap: int = 60) -> plan.Stage:
    return plan.Stage(name, cap, (sys.executable, *command))


def test_the_dry_run_stops_the_command_once_its_arguments_parse(monkeypatch) -> None:
    """fastbert's command parses with parse_known_args (its subcommand's parser inside): the
    dry run stops there, where it ran the command itself when only parse_args was held."""
    from fastbert.commands import info

    def ran(args):
        raise AssertionError("the command ran")

    monkeypatch.setattr(info, "run", ran)
    assert dry_run.parses("fastbert.cli", ["info"]) is None
    assert "unrecognized arguments: --nope" in dry_run.parses("fastbert.cli", ["info", "--nope"])


def test_dry_run_names_what_would_not_start() -> None:
    stages = [
        _stage("bad-flag", "-m", "benchmarks.corpus_tokens", "--out", "x", "--no-such-flag"),
        _stage("no-module", "-m", "benchmarks.no_such_module"),
        _stage("fine", "-m", "benchmarks.gpu_limits", "--out", "x.json"),
        _stage("no-tests", "-m", "pytest", "-o", "addopts=", "tests/test_gpu_run.py", "-k", "zzz"),
        plan.Stage("no-program", 10, ("no-such-program-here",)),
    ]
    problems = dry_run.check(stages, REPO)
    assert "--no-such-flag" in problems["bad-flag"]
    assert "No module named" in problems["no-module"]
    assert problems["fine"] is None
    assert "collected 0 tests" in problems["no-tests"]
    assert "not found" in problems["no-program"]


def test_dry_run_names_modules_neither_installed_nor_bundled(tmp_path: Path) -> None:
    stage = plan.Stage("serving", 10, ("no-such-program-here",), needs=("json", "fastbert_absent"))
    (problem,) = dry_run.check([stage], REPO, wheel_folder=tmp_path).values()
    assert "needs fastbert_absent:" in problem and "json" not in problem
    assert f"python -m benchmarks.gpu_run.wheels --out {tmp_path}" in problem
    (tmp_path / "fastbert_absent-1.0-py3-none-any.whl").touch()
    assert dry_run.missing(stage.needs, tmp_path) is None


def _distribution(site: Path, name: str, *requires: str) -> None:
    info = site / f"{name.replace('-', '_')}-1.{len(requires)}.dist-info"
    info.mkdir(parents=True)
    lines = [f"Name: {name}", f"Version: 1.{len(requires)}"]
    (info / "METADATA").write_text("\n".join(lines + [f"Requires-Dist: {r}" for r in requires]))


def test_wheels_follow_requirements_for_the_target_python(tmp_path, monkeypatch) -> None:
    _distribution(
        tmp_path, "fb-top", "fb-leaf>=1", "fb-old; python_version < '3.11'", "fb-x; extra == 'x'"
    )
    _distribution(tmp_path, "fb-leaf")
    _distribution(tmp_path, "fb-old", "fb-leaf")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert wheels.closure(["fb_top"], "3.12") == {"fb-leaf": "1.0", "fb-top": "1.3"}
    assert list(wheels.closure(["fb-top"], "3.10")) == ["fb-leaf", "fb-old", "fb-top"]
    command = wheels.download_command({"fb-top": "1.3"}, tmp_path, "3.12")
    assert command[-1] == "fb-top==1.3" and "--no-deps" in command
    assert command[command.index("--python-version") + 1] == "3.12"
    assert "--only-binary=:all:" in command and "manylinux_2_28_x86_64" in command


def test_install_goes_on_without_wheels(tmp_path: Path, capsys) -> None:
    install.install_wheels(sys.executable, tmp_path)
    assert "no wheels in" in capsys.readouterr().out
    assert wheels.install_command("py", tmp_path)[-len(wheels.REQUIREMENTS) :] == list(
        wheels.REQUIREMENTS
    )


def test_dry_run_collects_without_the_worker_options() -> None:
    command = ("python", "-m", "pytest", "-q", "-n", "12", "--dist", "load", "tests")
    assert dry_run.collect_command(command) == [
        "python",
        "-m",
        "pytest",
        "--collect-only",
        "-q",
        "tests",
    ]


# --- the runner ------------------------------------------------------------------------------


def test_a_stage_past_its_limit_is_interrupted_and_keeps_its_output(tmp_path: Path) -> None:
    code = "import time; print('measured so far', flush=True); time.sleep(120)"
    outcome = runner.run_stage(_stage("slow", "-c", code), 2, tmp_path / "slow.log", REPO)
    assert outcome.status == "timed out"
    assert outcome.seconds < runner.SECOND_SIGINT_S  # Python stops at the first SIGINT
    assert "measured so far" in (tmp_path / "slow.log").read_text()


def test_stages_run_in_order_and_a_failure_does_not_stop_the_run(tmp_path: Path) -> None:
    stages = [
        _stage("fails", "-c", "raise SystemExit(3)"),
        _stage("works", "-c", "print('fine')"),
        plan.Stage("later", 600, (sys.executable, "-c", "pass"), leftover=True),
    ]
    import time

    deadline = time.monotonic() + runner.FINAL_S + runner.KILL_S + 60
    outcomes = runner.run_all(stages, tmp_path, REPO, deadline, report=lambda line: None)
    assert [(o.name, o.status, o.exit_code) for o in outcomes] == [
        ("fails", "failed", 3),
        ("works", "ok", 0),
        ("later", "ok", 0),
    ]
    recorded = runner.read_outcomes(tmp_path / runner.STAGES_JSON)
    assert [o["status"] for o in recorded] == ["failed", "ok", "ok"]


def test_a_stage_whose_input_stage_did_not_finish_is_skipped(tmp_path: Path) -> None:
    import time

    stages = [
        _stage("model", "-c", "raise SystemExit(1)"),
        plan.Stage("serve", 60, (sys.executable, "-c", "pass"), after=("model",)),
    ]
    deadline = time.monotonic() + runner.FINAL_S + runner.KILL_S + 60
    outcomes = runner.run_all(stages, tmp_path, REPO, deadline, report=lambda line: None)
    assert outcomes[1].status == "skipped" and "needs model" in outcomes[1].note


def test_a_stage_leaves_the_floors_of_later_ones_and_one_without_time_is_skipped(
    tmp_path: Path,
) -> None:
    first = plan.Stage("first", 100, ("true",))
    later = [plan.Stage("a", 10, ("true",), floor_s=20), plan.Stage("b", 10, ("true",), floor_s=30)]
    rest = plan.Stage("rest", 600, ("true",), floor_s=99, leftover=True)
    assert runner.limit_for(first, [*later, rest], 500) == 100
    assert runner.limit_for(first, [*later, rest], 150) == 150 - runner.KILL_S - 50
    outcomes = runner.run_all([first], tmp_path, REPO, deadline=0.0, report=lambda line: None)
    assert outcomes[0].status == "skipped" and "no time left" in outcomes[0].note


def test_the_caps_of_the_stages_that_always_run_fit_the_budget(tmp_path: Path) -> None:
    stages = plan.stages(tmp_path, tmp_path, "python3")
    always = [s for s in stages if not s.leftover]
    assert sum(s.cap_s for s in always) + runner.FINAL_S <= plan.BUDGET_S
    assert stages[0].name == "install" and stages[-1].leftover


# --- the test grid -----------------------------------------------------------------------------


def _item(function: str, **params) -> types.SimpleNamespace:
    callspec = types.SimpleNamespace(params=params) if params else None
    nodeid = f"tests/test_x.py::{function}" + (f"[{len(params)}]" if params else "")
    return types.SimpleNamespace(
        nodeid=nodeid,
        callspec=callspec,
        fixturenames=("device",),
        get_closest_marker=lambda name: None,
    )


def test_the_core_grid_pairs_every_dtype_with_every_other_value() -> None:
    dtypes = (torch.float32, torch.float16, torch.bfloat16)
    seqs = (1, 128, 512)
    items = [_item("test_op", dtype=d, seq=s) for d in dtypes for s in seqs]
    items += [_item("test_plain"), _item("test_shape", size=1), _item("test_shape", size=2)]
    core = grid.core(items)
    pairs = {(i.callspec.params["dtype"], i.callspec.params["seq"]) for i in core[:-3]}
    assert pairs == {(d, s) for d in dtypes for s in seqs}  # no pair is redundant here
    assert [i.nodeid for i in core[-3:]] == [i.nodeid for i in items[-3:]]
    redundant = [_item("test_op", dtype=torch.float16, seq=128, other=k) for k in (1, 1)]
    assert len(grid.core(redundant)) == 1


def test_the_core_takes_the_files_in_turn() -> None:
    items = [
        types.SimpleNamespace(nodeid=f"tests/test_{f}.py::t[{i}]") for f in "ab" for i in range(6)
    ]
    order = [item.nodeid for item in grid.in_turn(items, turn=4)]
    assert order == [
        *(f"tests/test_a.py::t[{i}]" for i in range(4)),
        *(f"tests/test_b.py::t[{i}]" for i in range(4)),
        *(f"tests/test_a.py::t[{i}]" for i in (4, 5)),
        *(f"tests/test_b.py::t[{i}]" for i in (4, 5)),
    ]


def test_the_grid_is_the_tests_that_run_on_a_gpu() -> None:
    on_gpu = types.SimpleNamespace(get_closest_marker=lambda name: name == "gpu" or None)
    on_device = _item("test_device")
    cpu_only = types.SimpleNamespace(fixturenames=("tmp_path",), get_closest_marker=lambda n: None)
    assert grid.runs_on_gpu(on_gpu) and grid.runs_on_gpu(on_device)
    assert not grid.runs_on_gpu(cpu_only)
    items = [_item("test_op", dtype=d) for d in (torch.float16, torch.float16)] + [cpu_only]
    assert grid.select(items, "core") == items[:1]
    assert grid.select(items, "rest") == items[1:2]
    assert grid.select(items, "all") == items[:2]


# --- the summary -------------------------------------------------------------------------------


@pytest.fixture
def made_up_run(tmp_path: Path) -> Path:
    samples.write(tmp_path, plan.stages(tmp_path, tmp_path, "python3"))
    return tmp_path


def test_the_summary_says_each_target_met_or_missed(made_up_run: Path) -> None:
    text = summary.build(made_up_run)
    assert "BERT-base fp16 32x128 forward <= 1.2 ms: met, 1.1 ms (fastbert-graphs)" in text
    assert "32x128: >= 1.3x HF sdpa: met, 1.45x" in text
    assert "32x128: >= 1.1x torch.compile max-autotune: missed by 5%, 1.05x" in text
    assert "corpus, s512 fp16: >= 2.0M tokens/s: met, 2.20M tokens/s (padding-free)" in text
    assert "without CUDA graphs float16 s512 1.20M" in text
    assert "head dim 64, s512 fp16: >= 340 TFLOP/s: met, 355 TFLOP/s (64x512)" in text
    assert "GPU tests: core 2 passed, 1 failed, 0 errors, 1 skipped; rest not run" in text
    assert "FAILED tests.test_softmax::test_gpu_long_rows[float32]" in text
    assert "attention float16 64x512 355 TFLOP/s 46%" in text  # of the fp16 GEMM's 770
    assert "layer_norm float16 64x512 2.6 TB/s 87%" in text
    assert "32x128 fastbert 30.0 ms (1.20x sdpa)" in text


def test_a_partial_run_reads_as_not_measured(made_up_run: Path) -> None:
    for name in ("bench/results.json", "corpus/corpus.json", "bench/kernels-bench.json"):
        (made_up_run / name).unlink()
    (made_up_run / "limits.json").write_text("{not json")
    outcomes = json.loads((made_up_run / runner.STAGES_JSON).read_text())
    outcomes[3].update(status="timed out", exit_code=130)
    (made_up_run / runner.STAGES_JSON).write_text(json.dumps(outcomes))
    text = summary.build(made_up_run)
    assert "\nbench               timed out    130" in text
    assert "BERT-base fp16 forward: not measured" in text
    assert text.count(": not measured, ") == 5
    assert "GPU limits (measured): not measured" in text


# --- the benchmark scripts the run adds ------------------------------------------------------


def test_corpus_lengths() -> None:
    mixed = corpus_tokens.lengths("mixed", 50_000)
    assert sum(mixed) >= 50_000 and sum(mixed[:-1]) < 50_000
    assert min(mixed) >= 8 and max(mixed) <= 512 and 60 <= sorted(mixed)[len(mixed) // 2] <= 140
    assert corpus_tokens.lengths("s512", 5000) == [512] * 9


def test_corpus_tokens_on_a_cpu(tmp_path: Path) -> None:
    argv = ["--out", str(tmp_path), "--model", "bert-tiny", "--dtypes", "float32"]
    argv += ["--device", "cpu", "--tokens", "2048", "--reps", "1", "--cuda-graphs", "auto,false"]
    assert corpus_tokens.main(argv) == 0
    rows = json.loads((tmp_path / corpus_tokens.CORPUS_JSON).read_text())["rows"]
    assert [(r["distribution"], r["cuda_graphs"], r["tokens"] >= 2048 - 512) for r in rows] == [
        ("s512", "auto", True),
        ("s512", "false", True),
        ("mixed", "auto", True),
        ("mixed", "false", True),
    ]
    for row in rows:  # the parts are the pass's time, less the loop's own
        parts = sum(row[f"{part}_s"] for part in corpus_tokens.PARTS)
        assert row["tokens_per_s"] > 0 and 0 < parts <= row["median_s"] * 1.5


def test_corpus_embedder_runs_fastbert_embeds_path() -> None:
    """The corpus benchmark embeds as fastbert.embed does (its packed path: forward_packed,
    pooled per document), and gets what a padded batch of the same documents pooled gives."""
    from fastbert.model.pooling import mean_pool

    embedder, vocab = corpus_tokens.build_embedder("bert-tiny", torch.float32, torch.device("cpu"))
    calls = []
    forward_packed = embedder.model.forward_packed
    embedder.model.forward_packed = lambda *a, **k: calls.append(a) or forward_packed(*a, **k)
    documents = corpus_tokens.corpus([9, 3, 17], vocab, seed=1)
    vectors = embedder(documents)
    assert len(calls) == 1 and calls[0][0].shape == (29,)
    ids = torch.zeros(3, 17, dtype=torch.long)
    mask = torch.zeros(3, 17, dtype=torch.long)
    for row, document in enumerate(documents):
        ids[row, : len(document)] = torch.tensor(document)
        mask[row, : len(document)] = 1
    with torch.inference_mode():
        hidden = embedder.model(ids, attention_mask=mask).last_hidden_state
    expected = torch.nn.functional.normalize(mean_pool(hidden, mask), dim=-1)
    np.testing.assert_allclose(vectors, expected.numpy(), rtol=1e-5, atol=1e-6)


def test_random_folder_tokenizes_offline(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    folder = random_folder.build(tmp_path / "model", "bert-tiny")
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    ids = tokenizer(["The quick brown fox.", "Python's help texts"])["input_ids"]
    cls, sep = tokenizer.convert_tokens_to_ids(["[CLS]", "[SEP]"])
    assert all(row[0] == cls and row[-1] == sep and len(row) > 3 for row in ids)
    assert tokenizer.unk_token_id not in ids[0]
    assert json.loads((folder / "1_Pooling" / "config.json").read_text())[
        "pooling_mode_mean_tokens"
    ]


def test_stages_chosen_by_name_keep_the_plans_order_and_scale_their_caps(tmp_path) -> None:
    from benchmarks.gpu_run.__main__ import chosen

    every = plan.stages(tmp_path, tmp_path, sys.executable)
    caps = {s.name: s.cap_s for s in every}
    picked = chosen(every, ["serve", "corpus"], 2.0)
    assert [s.name for s in picked] == ["corpus", "serve"]
    assert [s.cap_s for s in picked] == [2 * caps["corpus"], 2 * caps["serve"]]
    assert [s.name for s in chosen(every, None, 1.0)] == list(caps)
    with pytest.raises(ValueError, match="no stage named nope"):
        chosen(every, ["corpus", "nope"], 1.0)


@pytest.mark.parametrize("flags", [["--stages", "nope"], ["--cap-scale", "0"]])
def test_a_bad_stage_choice_is_a_usage_error(tmp_path, flags) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_run", str(tmp_path / "out"), *flags],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "error:" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_host_overhead_on_a_cpu(tmp_path: Path) -> None:
    """On a CPU the kernels' launches are no-ops under the interpreter: the benchmark counts
    them (a BERT layer launches 7 kernels: QKV, attention, output projection, LayerNorm, the
    two feed-forward linears, LayerNorm; the embeddings and the pooler one each) and times
    fastbert's side."""
    from benchmarks import host_overhead

    argv = ["--out", str(tmp_path), "--model", "bert-tiny", "--shapes", "2x16", "--reps", "2"]
    assert host_overhead.main(argv + ["--device", "cpu"]) == 0
    (row,) = json.loads((tmp_path / host_overhead.HOST_JSON).read_text())["rows"]
    layers = MODEL_SHAPES["bert-tiny"]["num_hidden_layers"]
    assert row["shape"] == "2x16" and row["launches"] == 2 + 7 * layers
    assert row["wrappers_ms"] > 0 and "forward_ms" not in row
    assert "fastbert/kernels/op.py" in (tmp_path / host_overhead.PROFILE_TXT).read_text()
