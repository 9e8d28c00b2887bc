"""``dflash-convert publish``: a release directory of validated files, sums, reports and a card; the upload.

What is proved, on a tiny real drafter and the Qwen3 target: the release holds exactly the files, one
``validate --json`` report beside each, a ``SHA256SUMS`` the real ``sha256sum -c`` accepts and a
card huggingface_hub's ``ModelCard`` parses (front matter, table, pairing, llama.cpp commit, the
llama-server lines); each quantized file is byte for byte ``quantize`` of the released BF16 file; the
upload commits exactly the release's files to a local server standing in for the hub, and a file
that fails validate (a real one: a pre-tokenizer the target does not use) stops the release with
one error line, no directory and not one request; an existing directory, an input as the release,
a missing token, a malformed source card are one line each; SIGINT or SIGTERM leave nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import cli_server
import pytest
from huggingface_hub import ModelCard

from dflash_convert.errors import DFlashError, InputFileError
from dflash_convert.files import sha256_file
from dflash_convert.publish import publish, summary_rows
from dflash_convert.quantize import quantize
from dflash_convert.release_card import CARD_NAME, SUMS_NAME
from dflash_convert.upload import Timeouts, upload_release
from dflash_convert.validate import validate
from dflash_convert.validate.report import LLAMA_CPP_COMMIT
from fixtures.drafters import make_zlab_drafter
from fixtures.recording_hub import start_recording_hub

TYPES = "BF16,Q8_0,Q4_K_M"
SOURCE_CARD = "---\nlicense: apache-2.0\npipeline_tag: text-generation\nbase_model: Qwen/Qwen3-8B\n---\n# a drafter\n"
DRAFTER_REPO = "z-lab/Qwen3-8B-DFlash-b16"
TARGET_REPO, TARGET_REV = "Qwen/Qwen3-8B", "b968826d9c46dd6066d109eabc6255188de91218"
TIMEOUT = 120


def cli(*args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    full.update(env or {})
    return cli_server.run(*args, timeout=TIMEOUT, env=full)


def one_error_line(r: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("dflash-convert: error: "), r.stderr
    assert "Traceback" not in r.stderr
    return lines[0]


def nothing_left(folder: Path, release: Path) -> None:
    """No release directory, no staging directory, no temporary file of ours in its folder."""
    assert not os.path.lexists(release)
    assert [p.name for p in folder.iterdir() if p.name.startswith(".")] == []


@pytest.fixture(scope="module")
def drafter(tmp_path_factory) -> Path:
    src = make_zlab_drafter(tmp_path_factory.mktemp("publish") / "Qwen3-tiny-DFlash", target_layer_ids=[0, 2])
    (src / CARD_NAME).write_text(SOURCE_CARD)
    return src


@pytest.fixture(scope="module")
def released(tmp_path_factory, drafter, qwen3_target):
    out = tmp_path_factory.mktemp("release") / "release"
    rel = publish(drafter, qwen3_target, out, types=TYPES, drafter_repo=DRAFTER_REPO, target_repo=TARGET_REPO,
                  target_revision=TARGET_REV)
    return rel, out


@pytest.mark.slow  # runs a model (or a whole release) end to end
def test_the_release_holds_the_files_their_reports_the_sums_and_the_card(released):
    rel, out = released
    ggufs = [f.name for f in rel.files]
    assert ggufs == ["dflash-Qwen3-Tiny-DFlash-BF16.gguf", "dflash-Qwen3-Tiny-DFlash-Q8_0.gguf", "dflash-Qwen3-Tiny-DFlash-Q4_K_M.gguf"]
    assert sorted(os.listdir(out)) == rel.names == sorted([*ggufs, *(g + ".validate.json" for g in ggufs), SUMS_NAME, CARD_NAME])
    assert [f.type_name for f in rel.files] == ["BF16", "Q8_0", "Q4_K_M"] and rel.base_type == "BF16"
    for f in rel.files:
        assert f.size == (out / f.name).stat().st_size and f.sha256 == sha256_file(out / f.name) and f.validate == "pass"


@pytest.mark.slow  # runs a model (or a whole release) end to end
def test_sha256sums_passes_sha256sum_check(released):
    rel, out = released
    r = subprocess.run(["sha256sum", "--strict", "-c", SUMS_NAME], cwd=out, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    listed = sorted(line.split("  ", 1)[1] for line in (out / SUMS_NAME).read_text().splitlines())
    assert listed == [n for n in rel.names if n != SUMS_NAME]
    (out / rel.files[1].name).open("r+b").write(b"X")  # one byte changed: the check must see it
    try:
        bad = subprocess.run(["sha256sum", "-c", SUMS_NAME], cwd=out, capture_output=True, text=True)
        assert bad.returncode == 1 and f"{rel.files[1].name}: FAILED" in bad.stdout
    finally:
        (out / rel.files[1].name).open("r+b").write(b"G")  # GGUF magic restored


@pytest.mark.slow  # runs a model (or a whole release) end to end
def test_each_report_is_validate_json_against_the_target(released, qwen3_target):
    rel, out = released
    for f in rel.files:
        doc = json.loads((out / f.report_name).read_text())
        fresh = validate(out / f.name, qwen3_target).to_json()
        assert doc["file"] == f.name and doc["target"] == TARGET_REPO  # no local path in a published file
        assert doc["result"] == "pass" and doc["llama_cpp"] == LLAMA_CPP_COMMIT
        assert doc["checks"] == fresh["checks"] and any(c["id"] == "target.tokenizer" for c in doc["checks"])


@pytest.mark.slow  # runs a model (or a whole release) end to end
def test_quantized_files_are_quantize_of_the_released_full_precision_file(released, tmp_path):
    rel, out = released
    base = out / rel.files[0].name
    for f in rel.files[1:]:
        again = quantize(base, tmp_path / f.name, f.type_name)
        assert sha256_file(again.output) == f.sha256, f.type_name


@pytest.mark.slow  # runs a model (or a whole release) end to end
def test_the_card_parses_with_model_card_and_says_what_the_files_are(released):
    rel, out = released
    text = (out / CARD_NAME).read_text()
    assert text == rel.card
    card = ModelCard(text, ignore_metadata_errors=False)
    data = card.data.to_dict()
    assert data["base_model"] == DRAFTER_REPO and data["base_model_relation"] == "quantized"
    assert data["license"] == "apache-2.0" and data["pipeline_tag"] == "text-generation"  # from the source card
    assert {"gguf", "dflash", "speculative-decoding"} <= set(data["tags"])
    for f in rel.files:
        assert f"| `{f.name}` | {f.type_name} |" in text and f"`{f.sha256}`" in text
    assert f"`{TARGET_REPO}` at revision `{TARGET_REV}`" in text
    assert f"llama.cpp commit `{LLAMA_CPP_COMMIT}`" in text
    q4 = rel.files[2].name
    assert "llama-server -hf TARGET-GGUF-REPO:Q4_K_M -hfd ORG/NAME:Q4_K_M --spec-type draft-dflash --spec-draft-n-max 15" in text
    assert f"llama-server -m TARGET.gguf -md {q4} --spec-type draft-dflash --spec-draft-n-max 15" in text
    assert "fidelity" not in text.split("## Files", 1)[1].split("\n\n", 2)[1]  # no fidelity column without --check


@pytest.fixture
def hub(monkeypatch, tmp_path):
    server = start_recording_hub()
    monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
    monkeypatch.setenv("HF_TOKEN", "hf_test_token_not_real")
    yield server
    server.close()


@pytest.mark.slow  # runs a model (or a whole release) end to end
def test_upload_commits_exactly_the_release(hub, drafter, qwen3_target, tmp_path):
    out = tmp_path / "release"
    rel = publish(drafter, qwen3_target, out, types="BF16,Q8_0", upload="me/tiny-GGUF")
    assert sorted(hub.committed) == rel.names == sorted(os.listdir(out))
    for name, data in hub.committed.items():
        assert data == (out / name).read_bytes(), name
    assert all(r.path.startswith(("/api/repos/create", "/api/validate-yaml", "/api/models/me/tiny-GGUF/"))
               for r in hub.requests), hub.requests
    assert hub.validated_cards == [rel.card]
    commits = [r for r in hub.requests if "/commit/" in r.path]
    assert len(commits) == 1 and rel.uploaded is not None and rel.uploaded.endswith("/commit/" + "c0ffee" + "0" * 34)
    assert {r.authorization for r in hub.requests} == {"Bearer hf_test_token_not_real"}  # HF_TOKEN, on every request
    assert "-hfd me/tiny-GGUF:Q8_0" in rel.card  # no Q4_K_M in this release: the last file's type


def test_a_file_that_fails_validate_stops_the_release_and_nothing_is_sent(hub, drafter, qwen3_target, tmp_path):
    out = tmp_path / "release"
    # llama-bpe is a pre-tokenizer llama.cpp knows, but not the Qwen3 target's (qwen2): every file converted
    # with it fails validate's target.tokenizer check against that target
    r = cli("publish", drafter, "--target-model-dir", qwen3_target, "-o", out, "--types", TYPES, "--tokenizer-pre",
            "llama-bpe", "--upload", "me/tiny-GGUF", "-q", env={"HF_ENDPOINT": hub.endpoint, "HF_TOKEN": "hf_test_token"})
    line = one_error_line(r)
    assert r.returncode == 1 and "fails validate against the target (target.tokenizer" in line and "nothing was released" in line
    assert hub.requests == []
    nothing_left(tmp_path, out)


def test_upload_without_a_token_is_refused_before_any_work(drafter, qwen3_target, tmp_path):
    out = tmp_path / "release"
    r = cli("publish", drafter, "--target-model-dir", qwen3_target, "-o", out, "--upload", "me/tiny-GGUF",
            env={"HF_HOME": str(tmp_path / "hf-home"), "HF_ENDPOINT": "http://127.0.0.1:9"})
    assert r.returncode == 1 and "needs a Hugging Face token" in one_error_line(r)
    nothing_left(tmp_path, out)
    with pytest.raises(DFlashError, match="not a repo id"):
        publish(drafter, qwen3_target, out, upload="not a repo")


def test_upload_is_refused_offline_before_anything_is_built(drafter, qwen3_target, tmp_path):
    """HF_HUB_OFFLINE=1 with a token: one line, at once, no release directory and nothing beside it."""
    out = tmp_path / "release"
    r = cli("publish", drafter, "--target-model-dir", qwen3_target, "-o", out, "--types", "BF16,Q8_0", "--upload",
            "me/tiny-GGUF", env={"HF_HUB_OFFLINE": "1", "HF_TOKEN": "hf_test_token", "HF_ENDPOINT": "http://127.0.0.1:9"})
    assert r.returncode == 1 and "cannot upload with HF_HUB_OFFLINE set" in one_error_line(r)
    nothing_left(tmp_path, out)


def test_an_endpoint_that_never_answers_times_out(tmp_path, monkeypatch):
    """A server on 127.0.0.1 that accepts the connection and never answers: the upload fails with one error
    line within its timeouts (huggingface_hub's own client would wait forever)."""
    import socket
    import threading
    import time

    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept_and_say_nothing() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(conn)

    threading.Thread(target=accept_and_say_nothing, daemon=True).start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{listener.getsockname()[1]}")
    folder = tmp_path / "release"
    folder.mkdir()
    (folder / CARD_NAME).write_text("---\nlicense: mit\n---\n")
    start = time.monotonic()
    try:
        with pytest.raises(DFlashError, match=r"the upload to me/tiny-GGUF failed \(\w*Timeout"):
            upload_release(folder, "me/tiny-GGUF", "hf_test_token", [CARD_NAME], timeouts=Timeouts(connect=1, transfer=1))
    finally:
        listener.close()
        for conn in accepted:
            conn.close()
    assert accepted and time.monotonic() - start < 30


@pytest.mark.slow  # runs a model (or a whole release) end to end
def test_an_existing_release_needs_force_and_an_input_is_never_the_release(released, drafter, qwen3_target, tmp_path):
    out = tmp_path / "release"
    out.mkdir()
    (out / "old.txt").write_text("old release")
    r = cli("publish", drafter, "--target-model-dir", qwen3_target, "-o", out, "--types", "Q8_0", "-q")
    assert r.returncode == 1 and "exists; pass --force" in one_error_line(r)
    assert os.listdir(out) == ["old.txt"]
    r = cli("publish", drafter, "--target-model-dir", qwen3_target, "-o", out, "--types", "Q8_0", "--force", "-q")
    assert r.returncode == 0, r.stderr
    names = sorted(os.listdir(out))
    gguf = "dflash-Qwen3-Tiny-DFlash-Q8_0.gguf"
    assert names == sorted([gguf, gguf + ".validate.json", CARD_NAME, SUMS_NAME])
    assert "Q8_0" in r.stdout and "pass" in r.stdout  # the summary table
    # no float type asked for: quantized from a scratch conversion, which is not released, and the same bytes
    assert sha256_file(out / gguf) == released[0].files[1].sha256
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # the old release is gone
    for inp in (drafter, qwen3_target, drafter.parent):
        r = cli("publish", drafter, "--target-model-dir", qwen3_target, "-o", inp, "--force", "-q")
        assert r.returncode == 1 and "would replace an input" in one_error_line(r)
    assert (drafter / "config.json").is_file()


def test_dry_run_writes_nothing(drafter, qwen3_target, tmp_path):
    out = tmp_path / "release"
    r = cli("publish", drafter, "--target-model-dir", qwen3_target, "-o", out, "--types", TYPES, "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "dflash-Qwen3-Tiny-DFlash-Q4_K_M.gguf" in r.stdout and "from BF16" in r.stdout and "dry run: nothing written" in r.stdout
    nothing_left(tmp_path, out)


def test_types_and_the_source_card_are_checked(drafter, qwen3_target, tmp_path):
    out = tmp_path / "release"
    for types, why in (("Q4_K_M,q4_k_m", "names Q4_K_M twice"), ("Q9_Z", "unknown quantization type"), (",", "names no type")):
        with pytest.raises(DFlashError, match=why):
            publish(drafter, qwen3_target, out, types=types)
    bad = tmp_path / "bad-card"
    shutil.copytree(drafter, bad)
    (bad / CARD_NAME).write_text("---\nlicense: [apache-2.0\n---\n")
    r = cli("publish", bad, "--target-model-dir", qwen3_target, "-o", out, "--types", "Q8_0")
    line = one_error_line(r)
    assert r.returncode == 2 and f"{bad / CARD_NAME}: the model card's front matter is not valid YAML" in line
    with pytest.raises(InputFileError):
        publish(bad, qwen3_target, out, types="Q8_0")
    nothing_left(tmp_path, out)


def test_the_staging_directory_commits_as_every_output_does(tmp_path):
    """One commit for files and the release directory: a release that appeared meanwhile is not replaced
    (unless replace), and a staging directory swapped for another is never released."""
    from dflash_convert.outputs import TemporaryDirectory

    out = tmp_path / "release"
    with TemporaryDirectory(out) as staging:
        (staging.path / "a.gguf").write_text("new")
        out.mkdir()  # another run got there first
        (out / "old.txt").write_text("old")
        with pytest.raises(DFlashError, match="output appeared while this run was writing it"):
            staging.commit()
        staging.commit(replace=True)
    assert sorted(os.listdir(out)) == ["a.gguf"] and [p.name for p in tmp_path.iterdir()] == ["release"]
    with TemporaryDirectory(tmp_path / "second") as staging:
        os.rename(staging.path, tmp_path / "moved")
        staging.path.mkdir()  # same name, another directory
        with pytest.raises(DFlashError, match="the temporary directory .* was moved or replaced"):
            staging.commit()
    assert not (tmp_path / "second").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([staging.path.name, "moved", "release"])  # not ours: left


@pytest.mark.parametrize("phase, sig, code", [("data", "SIGINT", 130), ("release", "SIGTERM", 143)])
def test_signals_leave_nothing(drafter, qwen3_target, tmp_path, phase, sig, code):
    """SIGINT while the first file is written, SIGTERM after every file and the card, just before the rename."""
    out = tmp_path / "release"
    r = cli("publish", drafter, "--target-model-dir", qwen3_target, "-o", out, "--types", "BF16,Q8_0", "-q",
            env={"DFLASH_CONVERT_FAULT": f"{phase}:{sig}"})
    assert r.returncode == code, r.stderr
    assert "Traceback" not in r.stderr and "no partial output was left" in r.stderr
    nothing_left(tmp_path, out)


@pytest.mark.slow  # runs a model (or a whole release) end to end
def test_check_measures_each_file_and_the_card_shows_it(drafter, qwen3_target, tmp_path):
    """--check: check against the checkpoint per file (the target dir then needs its embedding)."""
    import torch
    from safetensors.torch import save_file

    target = tmp_path / "target"
    shutil.copytree(qwen3_target, target)
    cfg = json.loads((target / "config.json").read_text())
    emb = (torch.randn(cfg["vocab_size"], cfg["hidden_size"], generator=torch.Generator().manual_seed(7)) * 0.05)
    save_file({"model.embed_tokens.weight": emb.to(torch.bfloat16)}, str(target / "model.safetensors"))
    out = tmp_path / "release"
    rel = publish(drafter, target, out, types="BF16,Q8_0", check=True, device="cpu")
    for f in rel.files:
        assert f.fidelity is not None and f.fidelity["result"] == "pass" and f.fidelity["precision_class"] == f.type_name
        assert 0.85 <= f.fidelity["top1_agreement_tie_aware"] <= 1.0 and f.fidelity["kl_mean"] >= 0.0
    assert "| validate | fidelity (check) |" in rel.card
    assert f"| pass | pass: top-1 {rel.files[1].fidelity['top1_agreement_tie_aware']:.3f}" in rel.card
    rows = summary_rows(rel)
    assert rows[0].endswith("fidelity") and all("pass: top-1" in r for r in rows[1:])
    ModelCard((out / CARD_NAME).read_text(), ignore_metadata_errors=False)


def _on_a_terminal(*args: object) -> tuple[int, str]:
    """Run the command with stderr on a pseudo-terminal (80x24), as a user sees it: (exit code, what it showed)."""
    import fcntl
    import pty
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    p = subprocess.Popen([sys.executable, "-m", "dflash_convert.cli", *map(str, args)], stdout=subprocess.PIPE,
                         stderr=follower, env=env)
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    out, _ = p.communicate(timeout=TIMEOUT)
    os.close(leader)
    return p.returncode, shown.decode("utf-8", "replace") + out.decode()


@pytest.mark.slow  # runs a model (or a whole release) end to end
def test_one_bar_per_file_quiet_with_q_and_a_summary_table(drafter, qwen3_target, tmp_path):
    code, shown = _on_a_terminal("publish", drafter, "--target-model-dir", qwen3_target, "-o", tmp_path / "a",
                                 "--types", "BF16,Q8_0")
    assert code == 0, shown
    for name in ("dflash-Qwen3-Tiny-DFlash-BF16.gguf", "dflash-Qwen3-Tiny-DFlash-Q8_0.gguf"):
        assert f"{name}: validate pass" in shown  # the file's bar, left on the screen at its last step
        assert f"writing {name}" in shown  # the writer's byte bar beneath it
    table = shown[shown.index("file "):].splitlines()
    assert table[0].split() == ["file", "type", "size", "sha256", "validate"]
    assert table[1].split()[:2] == ["dflash-Qwen3-Tiny-DFlash-BF16.gguf", "BF16"] and table[1].split()[-1] == "pass"
    code, shown = _on_a_terminal("publish", drafter, "--target-model-dir", qwen3_target, "-o", tmp_path / "b",
                                 "--types", "BF16,Q8_0", "-q")
    assert code == 0, shown
    assert "validate pass" not in shown and "writing " not in shown and "\r" not in shown.split("file ", 1)[0]
    assert "dflash-Qwen3-Tiny-DFlash-Q8_0.gguf" in shown.split("file ", 1)[1]  # the summary table stays


@pytest.mark.slow  # runs a model (or a whole release) end to end
def test_provenance_comes_from_the_file_keys_when_the_arguments_do_not_say(released, drafter, qwen3_target, tmp_path):
    from drafter_gguf import kv, read_parts, set_key, write_parts

    from dflash_convert.publish import read_provenance
    from dflash_convert.sources.gguf import read_gguf

    rel, out = released
    parts = read_parts(out / rel.files[0].name)
    for short, value in (("source_hf_repo", DRAFTER_REPO), ("source_hf_commit", "1" * 40),
                         ("target_hf_repo", TARGET_REPO), ("target_hf_commit", TARGET_REV)):
        parts = set_key(parts, kv(short, value))
    tagged = write_parts(tmp_path / "tagged.gguf", parts)
    p = read_provenance(read_gguf(tagged), drafter, qwen3_target, drafter_repo=None, target_repo=None, target_revision=None)
    assert (p.drafter, p.drafter_revision, p.target, p.target_revision, p.drafter_is_repo) == (
        DRAFTER_REPO, "1" * 40, TARGET_REPO, TARGET_REV, True)
    other = read_provenance(read_gguf(tagged), drafter, qwen3_target, drafter_repo="me/fork", target_repo="Qwen/Qwen3-8B-Base",
                            target_revision=None)
    assert (other.drafter, other.drafter_revision, other.target, other.target_revision) == (
        "me/fork", None, "Qwen/Qwen3-8B-Base", None)  # a recorded revision is of the recorded repo only
    plain = read_provenance(read_gguf(out / rel.files[0].name), drafter, qwen3_target, drafter_repo=None, target_repo=None,
                            target_revision=None)
    assert (plain.drafter, plain.target, plain.drafter_is_repo, plain.target_revision) == (
        drafter.name, qwen3_target.name, False, None)


@pytest.mark.slow  # runs a model (or a whole release) end to end
def test_a_release_from_cached_repo_ids(drafter, qwen3_target, tmp_path, monkeypatch):
    """SRC and --target-model-dir as repo ids, read offline from a real Hugging Face cache layout: the
    files carry the resolved commits, the card names the repos and the target's revision, and the
    names are the ones llama.cpp discovers (general.name from the repo's name, as upstream derives it)."""
    from dflash_convert.format.file_names import discovery_problem
    from dflash_convert.format.keys import KEYS
    from dflash_convert.sources.gguf import read_gguf
    from fixtures.hub_cache import add_snapshot

    cache = tmp_path / "hub"
    drafter_commit = add_snapshot(cache, "z-lab/Qwen3-tiny-DFlash", drafter)
    target_commit = add_snapshot(cache, "Qwen/Qwen3-tiny", qwen3_target, refs=("main", "v1"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("HF_HOME", raising=False)
    out = tmp_path / "release"
    r = cli("publish", "z-lab/Qwen3-tiny-DFlash", "--target-model-dir", "Qwen/Qwen3-tiny@v1", "-o", out,
            "--types", "BF16,Q4_K_M", "-q")
    assert r.returncode == 0, r.stderr
    names = ["dflash-Qwen3-Tiny-DFlash-BF16.gguf", "dflash-Qwen3-Tiny-DFlash-Q4_K_M.gguf"]
    assert sorted(os.listdir(out)) == sorted([*names, *(n + ".validate.json" for n in names), CARD_NAME, SUMS_NAME])
    assert all(discovery_problem(n, dspark=False) is None for n in names)
    for n in names:
        g = read_gguf(out / n)
        try:
            got = [g.get(KEYS[k][0]) for k in ("source_hf_repo", "source_hf_commit", "target_hf_repo", "target_hf_commit")]
        finally:
            g.close()
        assert got == ["z-lab/Qwen3-tiny-DFlash", drafter_commit, "Qwen/Qwen3-tiny", target_commit], n
    card = (out / CARD_NAME).read_text()
    assert ModelCard(card).data.to_dict()["base_model"] == "z-lab/Qwen3-tiny-DFlash"
    assert f"`Qwen/Qwen3-tiny` at revision `{target_commit}`" in card
    assert json.loads((out / (names[0] + ".validate.json")).read_text())["target"] == "Qwen/Qwen3-tiny"
    assert not list(cache.rglob("*.gguf"))  # nothing written into the cache
    r = subprocess.run(["sha256sum", "--strict", "-c", SUMS_NAME], cwd=out, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    # a release directory inside the cache is refused before anything is made there
    inside = cache / "models--Qwen--Qwen3-tiny" / "release"
    r = cli("publish", "z-lab/Qwen3-tiny-DFlash", "--target-model-dir", "Qwen/Qwen3-tiny", "-o", inside, "--types", "Q8_0")
    assert r.returncode == 1 and "inside the Hugging Face cache" in one_error_line(r)
    assert sorted(p.name for p in inside.parent.iterdir()) == ["blobs", "refs", "snapshots"]
